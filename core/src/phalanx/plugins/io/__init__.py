"""``lightning.pytorch.plugins.io``: the checkpoint IO plugins (phalanx's :mod:`phalanx.checkpoint_io`).

``XLACheckpointIO`` comes from ``phalanx-strategy-xla`` when installed. Names resolve on first use.
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
    if name == "XLACheckpointIO":
        from phalanx._registered_classes import registered_class

        return registered_class(name, module=__name__)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
