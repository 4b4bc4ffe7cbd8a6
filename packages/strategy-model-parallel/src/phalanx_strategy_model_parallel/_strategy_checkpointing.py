"""ModelParallelStrategy's checkpoint methods: distributed (DCP) or consolidated, on every rank.

Kept apart from ``strategy.py`` the way the core keeps checkpointing apart from ``Strategy``: the
state lives on all ranks as DTensor shards and pipeline stages, so every method here is collective
and replaces the base behaviour (rank 0 writing one file of plain tensors) wholesale.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx_strategy_model_parallel import _checkpoint as dist_ckpt
from phalanx_strategy_model_parallel import _consolidated as full_ckpt
from phalanx_strategy_model_parallel._layout import DATA_PARALLEL, TENSOR_PARALLEL

if TYPE_CHECKING:
    from phalanx_strategy_model_parallel._layout import MeshLayout

__all__ = ["ModelParallelCheckpointing"]


def _read_from_shards(checkpoint: Mapping[str, Any]) -> bool:
    """Whether ``checkpoint`` came from a DCP directory (already shaped like this run's shards).

    Judged by the marker of ``trainer_state.pt``, not by the presence of DTensors: an optimizer
    without state (plain SGD) or a mesh of size 1 holds none.
    """
    return "model_parallel" in checkpoint


def _require(checkpoint: Mapping[str, Any], key: str, what: str) -> None:
    if key not in checkpoint:
        msg = (
            f"The checkpoint has no {key!r} entry (keys: {sorted(checkpoint)}), so it holds no {what}. Fix: pass a "
            "checkpoint written by Trainer.save_checkpoint (a full one to resume training)."
        )
        raise CheckpointError(msg)


class ModelParallelCheckpointing:
    """Checkpoint methods mixed into :class:`~phalanx_strategy_model_parallel.strategy.ModelParallelStrategy`."""

    # Provided by ModelParallelStrategy / ParallelStrategy.
    save_distributed_checkpoint: bool
    optimizers: list[Optimizer]
    checkpoint_io: CheckpointIO
    is_global_zero: bool
    global_rank: int
    _module: nn.Module | None

    if TYPE_CHECKING:

        @property
        def layout(self) -> MeshLayout: ...

        def require_module(self) -> nn.Module: ...

        def barrier(self, name: str | None = None) -> None: ...

    @property
    def _partial(self) -> bool:
        """Whether this rank holds only some of the model's names (pipeline stages)."""
        return self.layout.pipeline_parallel > 1

    def module_state_dict(self) -> dict[str, Any]:
        """This rank's state by full-model names (DTensor shards; no communication)."""
        return get_model_state_dict(self.require_module())  # type: ignore[no-any-return]

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """Name-keyed sharded state: resharding on load matches by name, never by position."""
        return get_optimizer_state_dict(self.require_module(), optimizer)  # type: ignore[no-any-return]

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: PathLike, storage_options: Any | None = None) -> None:
        """Write a DCP directory (every rank) or one consolidated file (rank 0). Runs on every rank.

        Raises:
            MisconfigurationError: ``storage_options`` given (neither writer takes any).
        """
        if storage_options is not None:
            msg = f"ModelParallelStrategy.save_checkpoint(storage_options={storage_options!r}) is not supported; pass None."
            raise MisconfigurationError(msg)
        module = self.require_module()
        layout = self.layout
        if self.save_distributed_checkpoint:
            dist_ckpt.save_distributed(
                checkpoint,
                filepath,
                model=module,
                optimizers=self.optimizers,
                checkpoint_io=self.checkpoint_io,
                is_global_zero=self.is_global_zero,
                barrier=self.barrier,
                layout={"data_parallel": layout.data_parallel, "tensor_parallel": layout.tensor_parallel,
                        "pipeline_parallel": layout.pipeline_parallel},
            )
            return
        coords = layout.coordinates(self.global_rank)
        full_ckpt.save_consolidated(
            checkpoint,
            filepath,
            model=module,
            optimizers=self.optimizers,
            checkpoint_io=self.checkpoint_io,
            is_global_zero=self.is_global_zero,
            contributes=coords[DATA_PARALLEL] == 0 and coords[TENSOR_PARALLEL] == 0,
            barrier=self.barrier,
        )

    def remove_checkpoint(self, filepath: PathLike) -> None:
        """Rank 0 deletes the directory or file."""
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(filepath)

    def load_checkpoint(self, checkpoint_path: PathLike, *, weights_only: bool = True) -> dict[str, Any]:
        """Every rank reads, after setup: a DCP directory straight into this mesh's shards (resharding),
        a file whole. Nothing is applied until the ``load_*_state_dict`` calls.

        Raises:
            CheckpointError: Missing, incomplete, or of another model.
        """
        path = os.fspath(checkpoint_path)
        module = self.require_module()
        strict = getattr(module, "strict_loading", True)
        if os.path.isdir(path):
            return dist_ckpt.read_distributed(
                path, model=module, optimizers=self.optimizers, checkpoint_io=self.checkpoint_io,
                strict=strict, partial=self._partial,
            )
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        if isinstance(checkpoint, dict) and isinstance(checkpoint.get("state_dict"), Mapping):
            shapes = {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items() if hasattr(v, "shape")}
            dist_ckpt.check_model_matches(module, shapes, source=path, strict=strict, partial=self._partial)
        return checkpoint

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Apply sharded weights as read, or distribute a full state dict into the shards (collective)."""
        module = self.require_module()
        _require(checkpoint, "state_dict", "weights")
        state = checkpoint["state_dict"]
        if _read_from_shards(checkpoint):
            set_model_state_dict(module, state, options=StateDictOptions(strict=strict and not self._partial))
        else:
            full_ckpt.load_full_model(module, state, strict=strict, partial=self._partial)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Apply sharded optimizer states as read, or name-keyed full ones (consolidated files)."""
        _require(checkpoint, "optimizer_states", "optimizer state")
        states = checkpoint["optimizer_states"]
        module = self.require_module()
        if _read_from_shards(checkpoint):
            for optimizer, state in zip(self.optimizers, states):
                set_optimizer_state_dict(module, optimizer, state)
            return
        full_ckpt.load_full_optimizers(module, self.optimizers, list(states), source="checkpoint")
