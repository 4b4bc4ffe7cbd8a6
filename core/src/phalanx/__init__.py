"""phalanx: a Lightning-style Trainer whose distributed strategies are installable plugins.

Importing ``phalanx`` is cheap on purpose: ``Trainer``, ``Module`` and the other names (which
need torch) are resolved on first attribute access, so ``phalanx strategies`` and plugin
``_plugin.py`` modules can import this package without paying for torch.

The top-level names are ``lightning.pytorch``'s (``Trainer``, ``Callback``, ``seed_everything``,
``__version__``) with ``LightningModule`` and ``LightningDataModule`` renamed ``Module`` and
``DataModule``, so ``import phalanx as L`` serves a script written for ``import lightning as L``
(Lightning's ``Fabric`` has no phalanx counterpart), plus ``hookimpl`` for plugin authors.
"""

from __future__ import annotations

import importlib

from phalanx import registry as _registry
from phalanx.version import __version__

__all__ = ["Callback", "DataModule", "Module", "Trainer", "__version__", "hookimpl", "seed_everything"]

_LAZY = {
    "Trainer": "phalanx.trainer.trainer:Trainer",
    "Module": "phalanx.module:Module",
    "DataModule": "phalanx.datamodule:DataModule",
    "Callback": "phalanx.callbacks.callback:Callback",
    "seed_everything": "phalanx.utilities.seed:seed_everything",
    # Marker for plugin hook implementations: ``@hookimpl def phalanx_register_strategies(registry)``.
    # It is pluggy's, so it is resolved on first use: plain ``import phalanx`` does not load pluggy.
    "hookimpl": "phalanx.hookspecs:hookimpl",
}

TYPE_CHECKING = False  # typing's own flag, without importing typing (mypy reads this name as True)
if TYPE_CHECKING:
    from typing import Any

    from phalanx.callbacks.callback import Callback
    from phalanx.datamodule import DataModule
    from phalanx.hookspecs import hookimpl
    from phalanx.module import Module
    from phalanx.trainer.trainer import Trainer
    from phalanx.utilities.seed import seed_everything


#: Subpackages reachable as attributes after ``import phalanx as pl`` (``pl.callbacks.EarlyStopping``),
#: as Lightning's are after ``import lightning.pytorch as pl``; each is imported on first access.
_SUBPACKAGES = frozenset(
    (
        "accelerators",
        "callbacks",
        "core",
        "loggers",
        "loops",
        "plugins",
        "profilers",
        "strategies",
        "trainer",
        "tuner",
        "utilities",
    )
)


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"phalanx.{name}")
    target = _LAZY.get(name)
    if target is None:
        msg = f"module 'phalanx' has no attribute {name!r}"
        raise AttributeError(msg)
    module_name, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def _discover_plugins() -> None:
    """Fill every registry from the installed plugins; runs on the first read of any registry."""
    from phalanx.discovery import load_plugins

    load_plugins()


# The composition root: discovery is installed as the registries' fill-on-first-read callback, so
# phalanx.registry stays a plain container that never imports phalanx.discovery, and importing
# phalanx loads neither the plugins, pluggy, torch nor importlib.metadata.
for _each in _registry.GLOBAL_REGISTRIES:
    _each.fill_on_first_read(_discover_plugins)
del _each
