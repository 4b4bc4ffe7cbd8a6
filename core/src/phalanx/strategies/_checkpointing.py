"""Checkpoint state: what a strategy puts into a checkpoint and how it restores it.

Split from ``strategy.py`` because it is the part sharded strategies override wholesale (FSDP and
DeepSpeed gather or shard state here); everything goes through the strategy's CheckpointIO, and
only rank 0 writes or deletes files.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.checkpoint_io.checks import check_optimizer_count
from phalanx.errors import CheckpointError
from phalanx.utilities.optim import optimizers_to_device

__all__ = ["StrategyCheckpointing"]


class StrategyCheckpointing(ABC):
    """State-dict and checkpoint-file methods mixed into :class:`~phalanx.strategies.strategy.Strategy`."""

    # Provided by Strategy.
    optimizers: list[Optimizer]
    checkpoint_io: CheckpointIO

    @property
    @abstractmethod
    def root_device(self) -> torch.device:
        """See ``Strategy.root_device``."""

    @property
    @abstractmethod
    def is_global_zero(self) -> bool:
        """See ``Strategy.is_global_zero``."""

    @abstractmethod
    def require_module(self) -> nn.Module:
        """See ``Strategy.require_module``."""

    def module_state_dict(self) -> dict[str, Any]:
        """The Module's state dict (sharded strategies gather it first)."""
        return self.require_module().state_dict()

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """Lightning's name for :meth:`module_state_dict`."""
        return self.module_state_dict()

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Load ``checkpoint["state_dict"]`` into the Module.

        Raises:
            CheckpointError: The checkpoint has no ``"state_dict"``.
        """
        if "state_dict" not in checkpoint:
            msg = (
                f"The checkpoint has no 'state_dict' entry (keys: {sorted(checkpoint)}); it was not "
                "written by a phalanx/Lightning Trainer. Load it with torch.load and call "
                "module.load_state_dict yourself."
            )
            raise CheckpointError(msg)
        self.require_module().load_state_dict(checkpoint["state_dict"], strict=strict)

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The state dict of ``optimizer`` (sharded strategies consolidate it first)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Restore ``checkpoint["optimizer_states"]`` into ``optimizers``, in order, on the device.

        Raises:
            CheckpointError: The entry is missing or holds a different number of optimizers.
        """
        states = checkpoint.get("optimizer_states")
        if states is None:
            msg = (
                f"The checkpoint has no 'optimizer_states' entry (keys: {sorted(checkpoint)}); it holds "
                "weights only. Load it into the model only, or resume from a full training checkpoint."
            )
            raise CheckpointError(msg)
        check_optimizer_count(len(states), len(self.optimizers))
        for optimizer, state in zip(self.optimizers, states):
            optimizer.load_state_dict(state)
        optimizers_to_device(self.optimizers, self.root_device)

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        filepath: PathLike,
        storage_options: Any | None = None,
    ) -> None:
        """Write ``checkpoint`` through the CheckpointIO; only rank 0 writes."""
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: PathLike, *, weights_only: bool = True) -> dict[str, Any]:
        """Read a checkpoint through the CheckpointIO (every rank reads), tensors on CPU."""
        return self.checkpoint_io.load_checkpoint(checkpoint_path, weights_only=weights_only)

    def remove_checkpoint(self, filepath: PathLike) -> None:
        """Delete a checkpoint through the CheckpointIO; only rank 0 deletes."""
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(filepath)
