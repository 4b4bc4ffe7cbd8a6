"""FSDPStrategy's checkpoint methods: sharded or full state, saved and restored on every rank.

Kept apart from ``strategy.py`` the way the core keeps ``StrategyCheckpointing`` apart from
``Strategy``: this is the part that replaces the base behaviour wholesale (rank 0 writing one file
of plain tensors), because sharded state lives on all ranks and every call here is collective.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
from torch.optim import Optimizer

from phalanx.checkpoint_io import dcp, full_state
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.errors import MisconfigurationError
from phalanx_strategy_fsdp import _checkpoint as ckpt
from phalanx_strategy_fsdp._fsdp2 import FSDPModule

__all__ = ["FSDPCheckpointing"]


class FSDPCheckpointing:
    """Checkpoint methods mixed into :class:`~phalanx_strategy_fsdp.strategy.FSDPStrategy`."""

    # Provided by FSDPStrategy / Strategy.
    state_dict_type: str
    optimizers: list[Optimizer]
    checkpoint_io: CheckpointIO
    is_global_zero: bool
    world_size: int
    _module: nn.Module | None

    if TYPE_CHECKING:  # real implementations come from Strategy / ParallelStrategy (later in the MRO)

        def require_module(self) -> nn.Module: ...

        def barrier(self, name: str | None = None) -> None: ...

    def teardown(self) -> None:
        """Finish a background save first: it synchronises over process groups teardown destroys."""
        dcp.finish_saves(self.checkpoint_io, synchronize=False)
        super().teardown()  # type: ignore[misc]  # Strategy's, later in the MRO

    def module_state_dict(self) -> dict[str, Any]:
        """Sharded: this rank's DTensor shards (no communication). Full: gathered to rank 0 (collective)."""
        module = self.require_module()
        if self.state_dict_type == "sharded" or not isinstance(module, FSDPModule):
            return module.state_dict()
        return full_state.gather_model(module)

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """Name-keyed sharded state, or (full) position-keyed state gathered to rank 0 (collective)."""
        module = self.require_module()
        if not isinstance(module, FSDPModule):
            return optimizer.state_dict()
        if self.state_dict_type == "sharded":
            return get_optimizer_state_dict(module, optimizer)
        state = full_state.gather_optimizer(module, optimizer)
        return full_state.to_index_keys(state, full_state.optimizer_fqns(module, optimizer)) if state else {}

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: PathLike, storage_options: Any | None = None
    ) -> None:
        """Write a sharded directory (every rank) or a full file (rank 0). Must run on every rank.

        Raises:
            MisconfigurationError: ``storage_options`` given (DCP and the file writer take none).
        """
        if storage_options is not None:
            msg = f"FSDPStrategy.save_checkpoint(storage_options={storage_options!r}) is not supported; pass None."
            raise MisconfigurationError(msg)
        module = self.require_module()
        common = {"model": module, "optimizers": self.optimizers, "checkpoint_io": self.checkpoint_io}
        if self.state_dict_type == "sharded":
            dcp.save(
                checkpoint,
                filepath,
                **common,
                is_global_zero=self.is_global_zero,
                barrier=self.barrier,
                world_size=self.world_size,
                strategy="fsdp",
            )
        else:
            dcp.finish_saves(self.checkpoint_io)
            full_state.save_full(
                checkpoint, filepath, **common, is_global_zero=self.is_global_zero, barrier=self.barrier
            )

    def load_checkpoint(self, checkpoint_path: PathLike, *, weights_only: bool = True) -> dict[str, Any]:
        """Every rank reads, after setup. A sharded directory is read straight into state dicts shaped
        like this run's shards (resharding when the world size changed); a file is returned whole.
        Nothing is applied until :meth:`load_model_state_dict` / :meth:`load_optimizer_state_dict`.

        Raises:
            CheckpointError: Missing, incomplete, or of another model.
        """
        path = os.fspath(checkpoint_path)
        if not dcp.has_dcp_metadata(path):
            return self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        module = self.require_module()
        return dcp.read(
            path,
            model=module,
            optimizers=self.optimizers,
            checkpoint_io=self.checkpoint_io,
            strict=getattr(module, "strict_loading", True),
        )

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Load sharded weights as they are, or shard a full state dict into the model."""
        module = self.require_module()
        dcp.require_entry(checkpoint, ckpt.MODEL_KEY, "weights")
        state_dict = checkpoint[ckpt.MODEL_KEY]
        if ckpt.holds_shards(state_dict):
            dcp.apply_model_state(module, state_dict, strict=strict)
        else:
            full_state.load_full_model(module, state_dict, source="checkpoint", strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Load sharded optimizer states as they are, or full (position- or name-keyed) ones."""
        dcp.require_entry(checkpoint, ckpt.OPTIMIZER_KEY, "optimizer state")
        states = checkpoint[ckpt.OPTIMIZER_KEY]
        module = self.require_module()
        if ckpt.holds_shards(states) or dcp.read_from_shards(checkpoint):
            dcp.apply_optimizer_states(module, self.optimizers, states)
        else:
            full_state.load_full_optimizers(module, self.optimizers, states, source="checkpoint")
