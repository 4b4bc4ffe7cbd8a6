"""FTHSDPStrategy (``ft_hsdp``): FSDP2 inside each replica group, torchft across the groups.

Everything about the groups is ``ft_ddp``'s (the launcher, the lighthouse, the quorum before each
step, the commit gate, restarts, the options): this class only changes what happens inside a
group. The Module is sharded with FSDP2 (``fully_shard``) over the group's ranks, so each rank
holds ``1/devices`` of the weights, gradients and optimizer state; FSDP2 reduce-scatters the
gradients inside the group, and torchft then averages each rank's gradient shard over the groups
of the quorum (the replicate dimension of HSDP, made fault tolerant). A restarted group heals
rank by rank: its rank ``r`` receives the shards of rank ``r`` of a live group.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.optim import Optimizer

from phalanx.errors import MisconfigurationError
from phalanx_strategy_torchft._manager import state_size
from phalanx_strategy_torchft._sharded import (
    allreduce_shards,
    as_dtensors,
    full_state,
    restore_optimizer_layout,
    shard_full_state,
    to_local,
)
from phalanx_strategy_torchft.strategy import FTDDPStrategy

__all__ = ["FTHSDPStrategy"]


class FTHSDPStrategy(FTDDPStrategy):
    """Fault-tolerant HSDP with torchft: FSDP2 shards inside each replica group, torchft replicates across.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        auto_wrap_policy: Module classes that become their own FSDP2 unit (sharded before the
            root, so only one unit is gathered at a time); ``None``: the whole Module is one unit.
        reshard_after_forward: FSDP2's option: free the gathered weights after forward (less
            memory, one more all-gather in backward).
        **kwargs: :class:`FTDDPStrategy`'s options (``replica_groups``, ``min_replicas``,
            ``timeout``, ``quorum_timeout``, ``lighthouse``, ``max_restarts``,
            ``connect_timeout``) and ParallelStrategy's; the rest go to ``fully_shard``.

    Raises:
        MisconfigurationError: As :class:`FTDDPStrategy`, and for an ``auto_wrap_policy`` that is
            not a sequence of ``nn.Module`` subclasses.
    """

    strategy_name: ClassVar[str] = "ft_hsdp"
    forwards_options_to = (fully_shard, ("module", "mesh", "reshard_after_forward"))

    def __init__(
        self,
        accelerator: Any = None,
        *,
        auto_wrap_policy: Sequence[type[nn.Module]] | None = None,
        reshard_after_forward: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(accelerator, **kwargs)
        policy = tuple(auto_wrap_policy or ())
        if not all(isinstance(cls, type) and issubclass(cls, nn.Module) for cls in policy):
            msg = (
                f"FTHSDPStrategy(auto_wrap_policy={auto_wrap_policy!r}) must be a sequence of nn.Module "
                "subclasses (the layers that become their own FSDP2 unit), or None for one unit. "
                "Fix: e.g. auto_wrap_policy=[nn.TransformerEncoderLayer]."
            )
            raise MisconfigurationError(msg)
        self.auto_wrap_policy = policy
        self.reshard_after_forward = reshard_after_forward
        self._fully_shard_kwargs = self._ddp_kwargs  # FTDDPStrategy kept the extra keywords for DDP
        self._ddp_kwargs = {}
        self._device_mesh: DeviceMesh | None = None
        self._sync_blocked = False

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The 1-D mesh of this group's ranks that FSDP2 shards over (the replicate dim is torchft's)."""
        return self._device_mesh

    @property
    def keep_process_group_after_teardown(self) -> bool:
        """A sharded Module's DTensors need the group's process group after ``fit`` (as in fsdp)."""
        return isinstance(self.module, FSDPModule)

    @property
    def supports_inference_mode(self) -> bool:
        """False: FSDP2's all-gather buffers made under ``inference_mode`` cannot be reused in training."""
        return False

    # ------------------------------------------------------------------ sharding
    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Shard over the group's ranks; when fitting, create the torchft Manager first.

        The Module is its own wrapper (FSDP2 shards in place), so the optimizer, created after
        this, holds the sharded parameters and its state is sharded too.
        """
        if training:
            self._manager = self._create_manager()
            FTDDPStrategy._fits += 1
        if not isinstance(model, FSDPModule):
            self._shard(model)
        return model

    def _shard(self, model: nn.Module) -> None:
        if self._device_mesh is None:
            self._device_mesh = init_device_mesh(self.root_device.type, (self.group_size,), mesh_dim_names=("shard",))
        kwargs: dict[str, Any] = {"mesh": self._device_mesh, "reshard_after_forward": self.reshard_after_forward}
        kwargs.update(self._fully_shard_kwargs)
        # Every rank of the group starts from rank 0's weights before they are split (FSDP2 does not
        # broadcast); the heal at the first quorum then makes the groups equal to each other.
        self.broadcast_module_states(model)
        if self.auto_wrap_policy:  # inner units first: each parameter belongs to its innermost unit
            for module in model.modules():
                if module is not model and isinstance(module, self.auto_wrap_policy):
                    fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)

    @property
    def forward_wrapper(self) -> nn.Module | None:
        """The sharded Module itself: FSDP2's root hooks (gather, reshard) run around each step."""
        module = self.module
        return module if isinstance(module, FSDPModule) and isinstance(module, nn.Module) else None

    # ------------------------------------------------------------------ the gradient average
    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Accumulating micro-batches: no reduce-scatter in the group, no all-reduce across groups."""
        module = self.module
        if isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(False)
        self._sync_blocked = True
        try:
            yield
        finally:
            self._sync_blocked = False
            if isinstance(module, FSDPModule):
                module.set_requires_gradient_sync(True)

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        """FSDP2 has averaged the gradients in the group; average the shards across the quorum's groups.

        This runs inside the closure, before ``on_before_optimizer_step`` and clipping, so both see
        the gradient averaged over every rank of every participating group.
        """
        super().post_backward(closure_loss)
        if self._manager is not None and not self._sync_blocked:
            allreduce_shards(self._manager, self.require_module().parameters())

    # ------------------------------------------------------------------ the state a healing peer receives
    def _ft_state(self) -> dict[str, Any]:
        """This rank's shards (local tensors): the same rank of a healing group receives them."""
        state: dict[str, Any] = to_local(super()._ft_state())
        return state

    def _load_ft_state(self, state: dict[str, Any]) -> None:
        """Wrap the received shards as this rank's DTensors, load them as ft_ddp does, fix the optimizer."""
        model_state = as_dtensors(state["model"], self.require_module().state_dict())
        super()._load_ft_state({**state, "model": model_state})
        for optimizer in self.optimizers:
            restore_optimizer_layout(optimizer)
        self.heal_log[-1]["bytes"] = state_size([state["model"], state["optimizers"]])  # this rank's shards

    # ------------------------------------------------------------------ checkpoints (full, portable)
    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """True: a checkpoint is split into the shards of the already sharded Module."""
        return True

    def module_state_dict(self) -> dict[str, Any]:
        """Full weights, gathered inside the group (every rank of the group must call it)."""
        state: dict[str, Any] = full_state(self.require_module().state_dict())
        return state

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer's position-keyed state with full tensors (collective inside the group)."""
        state: dict[str, Any] = full_state(optimizer.state_dict())
        return state

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Split a full checkpoint's weights into this rank's shards, then load them."""
        if "state_dict" in checkpoint:
            own = self.require_module().state_dict()
            checkpoint = {**checkpoint, "state_dict": shard_full_state(checkpoint["state_dict"], own)}
        super().load_model_state_dict(checkpoint, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Load the full optimizer states, then keep only this rank's shard of each."""
        super().load_optimizer_state_dict(checkpoint)
        for optimizer in self.optimizers:
            restore_optimizer_layout(optimizer)

    def __repr__(self) -> str:
        return (
            f"FTHSDPStrategy(replica_groups={self.replica_groups}, min_replicas={self.min_replicas}, "
            f"lighthouse={self._lighthouse!r}, timeout={self.timeout}, quorum_timeout={self.quorum_timeout}, "
            f"auto_wrap_policy={[c.__name__ for c in self.auto_wrap_policy]}, "
            f"reshard_after_forward={self.reshard_after_forward})"
        )
