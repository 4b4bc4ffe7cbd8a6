"""phalanx-strategy-xla: torch-xla strategies (single_xla, xla, xla_debug, xla_fsdp) for phalanx.

Names resolve lazily: importing this package (which discovery does to reach ``_plugin``) must not
import torch or torch_xla, so ``phalanx strategies`` stays fast where torch-xla is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "SingleDeviceXLAStrategy",
    "XLAAccelerator",
    "XLACheckpointIO",
    "XLAEnvironment",
    "XLAFSDPStrategy",
    "XLALauncher",
    "XLAPrecision",
    "XLAStrategy",
]

__version__ = "0.1.0"

_LAZY = {
    "SingleDeviceXLAStrategy": "phalanx_strategy_xla.single_device",
    "XLAAccelerator": "phalanx_strategy_xla.accelerator",
    "XLACheckpointIO": "phalanx_strategy_xla.checkpoint_io",
    "XLAEnvironment": "phalanx_strategy_xla.environment",
    "XLAFSDPStrategy": "phalanx_strategy_xla.spmd",
    "XLALauncher": "phalanx_strategy_xla.launcher",
    "XLAPrecision": "phalanx_strategy_xla.precision",
    "XLAStrategy": "phalanx_strategy_xla.strategy",
}

if TYPE_CHECKING:
    from phalanx_strategy_xla.accelerator import XLAAccelerator
    from phalanx_strategy_xla.checkpoint_io import XLACheckpointIO
    from phalanx_strategy_xla.environment import XLAEnvironment
    from phalanx_strategy_xla.launcher import XLALauncher
    from phalanx_strategy_xla.precision import XLAPrecision
    from phalanx_strategy_xla.single_device import SingleDeviceXLAStrategy
    from phalanx_strategy_xla.spmd import XLAFSDPStrategy
    from phalanx_strategy_xla.strategy import XLAStrategy


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module 'phalanx_strategy_xla' has no attribute {name!r}; available: {', '.join(sorted(_LAZY))}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
