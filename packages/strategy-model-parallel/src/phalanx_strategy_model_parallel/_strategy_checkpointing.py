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
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.optim import Optimizer

from phalanx.checkpoint_io import dcp, full_state
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.errors import MisconfigurationError
from phalanx_strategy_model_parallel._layout import CONTEXT_PARALLEL, DATA_PARALLEL, TENSOR_PARALLEL

if TYPE_CHECKING:
    from phalanx_strategy_model_parallel._layout import MeshLayout

__all__ = ["ModelParallelCheckpointing"]


class ModelParallelCheckpointing:
    """Checkpoint methods mixed into :class:`~phalanx_strategy_model_parallel.strategy.ModelParallelStrategy`."""

    # Provided by ModelParallelStrategy / ParallelStrategy.
    save_distributed_checkpoint: bool
    optimizers: list[Optimizer]
    checkpoint_io: CheckpointIO
    is_global_zero: bool
    global_rank: int
    world_size: int
    _module: nn.Module | None

    if TYPE_CHECKING:

        @property
        def layout(self) -> MeshLayout: ...

        def require_module(self) -> nn.Module: ...

        def barrier(self, name: str | None = None) -> None: ...

    def teardown(self) -> None:
        """Finish a background save first: it synchronises over process groups teardown destroys."""
        dcp.finish_saves(self.checkpoint_io, synchronize=False)
        super().teardown()  # type: ignore[misc]  # Strategy's, later in the MRO

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

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: PathLike, storage_options: Any | None = None
    ) -> None:
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
            dcp.save(
                checkpoint,
                filepath,
                model=module,
                optimizers=self.optimizers,
                checkpoint_io=self.checkpoint_io,
                is_global_zero=self.is_global_zero,
                barrier=self.barrier,
                world_size=self.world_size,
                strategy="model_parallel",
                layout={
                    "data_parallel": layout.data_parallel,
                    "data_parallel_replicate": layout.data_parallel // layout.data_parallel_shard,
                    "context_parallel": layout.context_parallel,
                    "tensor_parallel": layout.tensor_parallel,
                    "pipeline_parallel": layout.pipeline_parallel,
                },
            )
            return
        dcp.finish_saves(self.checkpoint_io)
        coords = layout.coordinates(self.global_rank)
        # One consolidated file: name-keyed optimizer state (a rank holds only its pipeline stage's
        # parameters), each stage sent to rank 0 by its first replica.
        full_state.save_full(
            checkpoint,
            filepath,
            model=module,
            optimizers=self.optimizers,
            checkpoint_io=self.checkpoint_io,
            is_global_zero=self.is_global_zero,
            barrier=self.barrier,
            positional_optimizer_state=False,
            stage_holder=coords[DATA_PARALLEL] == 0 and coords[CONTEXT_PARALLEL] == 0 and coords[TENSOR_PARALLEL] == 0,
        )

    def load_checkpoint(self, checkpoint_path: PathLike, *, weights_only: bool = True) -> dict[str, Any]:
        """Every rank reads, after setup: a DCP directory straight into this mesh's shards (resharding),
        a file whole. Nothing is applied until the ``load_*_state_dict`` calls.

        Raises:
            CheckpointError: Missing, incomplete, or of another model.
        """
        path = os.fspath(checkpoint_path)
        module = self.require_module()
        strict = getattr(module, "strict_loading", True)
        if dcp.has_dcp_metadata(path) or os.path.isdir(path):
            return dcp.read(
                path,
                model=module,
                optimizers=self.optimizers,
                checkpoint_io=self.checkpoint_io,
                strict=strict,
                partial=self._partial,
            )
        checkpoint = self.checkpoint_io.load_checkpoint(path, weights_only=weights_only)
        if isinstance(checkpoint, dict) and isinstance(checkpoint.get("state_dict"), Mapping):
            shapes = {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items() if hasattr(v, "shape")}
            dcp.check_model_matches(module, shapes, source=path, strict=strict, partial=self._partial)
        return checkpoint

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Apply sharded weights as read, or distribute a full state dict into the shards (collective)."""
        module = self.require_module()
        dcp.require_entry(checkpoint, "state_dict", "weights")
        state = checkpoint["state_dict"]
        if dcp.read_from_shards(checkpoint):
            dcp.apply_model_state(module, state, strict=strict and not self._partial)
        else:
            full_state.load_full_model(module, state, source="checkpoint", strict=strict, partial=self._partial)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Apply sharded optimizer states as read, or full ones (consolidated files; position-keyed
        files of other strategies too, where this rank holds the whole model)."""
        dcp.require_entry(checkpoint, "optimizer_states", "optimizer state")
        states = checkpoint["optimizer_states"]
        module = self.require_module()
        if dcp.read_from_shards(checkpoint):
            dcp.apply_optimizer_states(module, self.optimizers, list(states))
            return
        full_state.load_full_optimizers(
            module, self.optimizers, list(states), source="checkpoint", partial=self._partial
        )
