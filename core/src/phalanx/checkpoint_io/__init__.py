"""Checkpoint IO: how checkpoint dicts are written to and read from storage."""

from __future__ import annotations

from phalanx.checkpoint_io.async_io import AsyncCheckpointIO
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.checkpoint_io.torch_io import TorchCheckpointIO

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO"]
