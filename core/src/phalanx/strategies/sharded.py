"""What a strategy whose parameters are sharded across ranks declares (fsdp, model_parallel).

Sharded parameters decide three of the capabilities (:mod:`phalanx.strategies.capabilities`) the same
way whatever does the sharding, so the in-repo sharded strategies, and a vendor's, take them from
:class:`ShardedParameters` instead of repeating them: put it before
:class:`~phalanx.strategies.parallel.ParallelStrategy` in the bases.
"""

from __future__ import annotations

__all__ = ["ShardedParameters"]


class ShardedParameters:
    """Mixin of a strategy whose parameters are sharded (DTensors): no inference mode, empty init on
    the meta device, checkpoints checked against the sharded model after setup."""

    @property
    def supports_inference_mode(self) -> bool:
        """False: FSDP2 reuses its all-gather buffers in training, and buffers made under
        ``torch.inference_mode`` cannot be updated later; evaluation uses ``torch.no_grad``."""
        return False

    @property
    def empty_init_on_meta(self) -> bool:
        """True: ``trainer.init_module(empty_init=True)`` builds on the meta device; setup allocates
        this rank's shards and runs each layer's ``reset_parameters``."""
        return True

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """True: a checkpoint is read into the sharded model, and checked against its layout there."""
        return True
