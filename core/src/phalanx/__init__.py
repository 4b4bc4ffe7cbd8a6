"""phalanx: a Lightning-style Trainer whose distributed strategies are installable plugins.

Importing ``phalanx`` is cheap on purpose: ``Trainer`` and ``Module`` (which need torch) are
resolved on first attribute access, so ``phalanx strategies`` and plugin ``_plugin.py`` modules can
import this package without paying for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pluggy

__all__ = ["Module", "Trainer", "__version__", "hookimpl"]

__version__ = "0.1.0"

#: Marker for plugin hook implementations: ``@hookimpl def phalanx_register_strategies(registry)``.
hookimpl = pluggy.HookimplMarker("phalanx")

_LAZY = {
    "Trainer": "phalanx.trainer.trainer:Trainer",
    "Module": "phalanx.module:Module",
}

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer.trainer import Trainer


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        msg = f"module 'phalanx' has no attribute {name!r}"
        raise AttributeError(msg)
    module_name, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


# The composition root: discovery installs itself as the registries' fill-on-first-read callback,
# so phalanx.registry stays a plain container that never imports phalanx.plugins. Neither module
# imports torch or importlib.metadata at import time.
from phalanx import plugins as _plugins  # noqa: E402, F401
