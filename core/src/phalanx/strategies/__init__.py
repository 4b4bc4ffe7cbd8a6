"""Strategy contracts, the strategy registry, and the strategy classes installed plugins provide.

``from phalanx.strategies import DDPStrategy`` works whenever some installed plugin registers a
strategy whose target class is named ``DDPStrategy``; when none does, the ImportError names the
distribution to install. The base classes are imported lazily so that reading the registry does not
import torch.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from phalanx._hints import install_hint, providing_distribution
from phalanx.errors import PluginUnavailableError
from phalanx.registry import StrategyRegistry

DISABLE_ENV = "PHALANX_DISABLE_PLUGINS"

if TYPE_CHECKING:
    from phalanx.strategies.parallel import ParallelStrategy
    from phalanx.strategies.single_device import SingleDeviceStrategy
    from phalanx.strategies.strategy import Strategy

__all__ = ["ParallelStrategy", "SingleDeviceStrategy", "Strategy", "StrategyRegistry"]

_CORE_CLASSES = {
    "Strategy": "phalanx.strategies.strategy",
    "ParallelStrategy": "phalanx.strategies.parallel",
    "SingleDeviceStrategy": "phalanx.strategies.single_device",
}


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    if name in _CORE_CLASSES:
        value = getattr(importlib.import_module(_CORE_CLASSES[name]), name)
        globals()[name] = value
        return value
    for entry in StrategyRegistry.entries():
        if entry.target_path.rpartition(":")[2].rpartition(".")[2] == name:
            return StrategyRegistry.import_class(entry.name)
    distribution = providing_distribution(name)
    if distribution is not None:
        from phalanx import _metadata  # not the phalanx.utilities façade: that sits above strategies

        if _metadata.version(distribution) is not None:
            msg = (
                f"cannot import {name!r} from 'phalanx.strategies': {distribution} is installed but its plugin did not "
                f"load (blocked by {DISABLE_ENV}={os.environ.get(DISABLE_ENV, '')!r}, or it failed); fix: run "
                f"`phalanx plugins` for the reason, and remove its entry point from {DISABLE_ENV} if it is blocked"
            )
        else:
            msg = f"cannot import {name!r} from 'phalanx.strategies': it is provided by {distribution}, which is not installed; fix: {install_hint(distribution)}"
        raise PluginUnavailableError(msg, name=name)
    msg = f"module 'phalanx.strategies' has no attribute {name!r}; installed strategies: {', '.join(StrategyRegistry.names())}"
    raise AttributeError(msg)
