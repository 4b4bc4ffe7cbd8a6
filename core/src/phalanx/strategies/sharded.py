"""What a strategy whose parameters are sharded across ranks declares and does (fsdp, model_parallel).

Sharded parameters decide three of the capabilities (:mod:`phalanx.strategies.capabilities`) the same
way whatever does the sharding, so the in-repo sharded strategies, and a vendor's, take them from
:class:`ShardedParameters` instead of repeating them: put it before
:class:`~phalanx.strategies.parallel.ParallelStrategy` in the bases.

They also build models the same way: ``configure_model`` under ``empty_init=True`` creates layers on
the meta device (shapes and dtypes, no storage); once they are sharded, each parameter describes
only this rank's shard, so allocating it (``to_empty``) and re-running each layer's
``reset_parameters`` gives every rank its shard without any rank ever holding the full model
(:func:`modules_needing_init`, then :func:`materialize_meta`). Initialisation draws random numbers
per shard, so the weights are not bit-equal to a one-process init: load a checkpoint where exact
weights matter. (Full checkpoints of such a model: :mod:`phalanx.checkpoint_io.full_state`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["ShardedParameters", "has_meta_tensors", "materialize_meta", "modules_needing_init"]


def has_meta_tensors(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` lives on the meta device."""
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def modules_needing_init(model: nn.Module) -> list[nn.Module]:
    """The submodules that directly own meta tensors; each must be able to initialise them.

    Call it *before* sharding and allocating (afterwards nothing is meta any more), so a model that
    cannot be initialised fails before any memory is allocated.

    Raises:
        MisconfigurationError: A module owns meta tensors but has no ``reset_parameters``; the
            message names its class and where it sits in the model.
    """
    found = [
        (name, module)
        for name, module in model.named_modules()
        if any(t.is_meta for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)))
    ]
    lacking = [(name, module) for name, module in found if not callable(getattr(module, "reset_parameters", None))]
    if lacking:
        classes = sorted({type(module).__name__ for _, module in lacking})
        where = ", ".join(name or "the root module" for name, _ in lacking[:5])
        msg = (
            f"configure_model created {classes} on the meta device (sharded init; at {where}), but these modules "
            "have no reset_parameters() to initialise their weights once their shards are allocated. Fix: define "
            "reset_parameters(self) on them (initialising every parameter and buffer they own), or create them "
            "outside torch.device('meta') (in __init__, or without empty_init)."
        )
        raise MisconfigurationError(msg)
    return [module for _, module in found]


def materialize_meta(model: nn.Module, modules: list[nn.Module], device: torch.device) -> None:
    """Allocate this rank's shards of ``model`` on ``device`` and initialise them with each of
    ``modules``' ``reset_parameters`` (from :func:`modules_needing_init`)."""
    import torch

    model.to_empty(device=device, recurse=True)
    with torch.no_grad():
        for module in modules:
            module.reset_parameters()  # type: ignore[operator]


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
