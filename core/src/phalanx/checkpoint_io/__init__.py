"""Checkpoint IO: how checkpoint dicts are written to and read from storage.

The names resolve on first use, so that torch-free modules of this package (the formats'
recognition, :mod:`phalanx.checkpoint_io.storage`) can be imported without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.checkpoint_io.async_io import AsyncCheckpointIO
    from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
    from phalanx.checkpoint_io.torch_io import TorchCheckpointIO

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO"]

_WHERE = {
    "AsyncCheckpointIO": "phalanx.checkpoint_io.async_io",
    "CheckpointIO": "phalanx.checkpoint_io.checkpoint_io",
    "TorchCheckpointIO": "phalanx.checkpoint_io.torch_io",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    msg = f"module 'phalanx.checkpoint_io' has no attribute {name!r}"
    raise AttributeError(msg)
