"""Strategy contracts, the strategy registry, and the strategy classes installed plugins provide.

``from phalanx.strategies import DDPStrategy`` works whenever some installed plugin registers a
strategy whose target class is named ``DDPStrategy``; when none does, the ImportError names the
distribution to install. The base classes are imported lazily so that reading the registry does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from phalanx._registered_classes import registered_class
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
    try:
        return registered_class(name, module="phalanx.strategies", registries=(StrategyRegistry,))
    except AttributeError:
        pass  # no plugin provides it: say which strategies are installed
    msg = f"module 'phalanx.strategies' has no attribute {name!r}; installed strategies: {', '.join(StrategyRegistry.names())}"
    raise AttributeError(msg)
