"""Tools for plugin authors to prove their plugins behave: one conformance kit per plugin kind.

Every name is imported lazily so that the pytest plugin (loaded into every pytest run of an
environment with phalanx installed) costs nothing until a suite uses a kit.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.testing.conformance import START_METHODS_CHECKED, StrategyConformance, reference_run
    from phalanx.testing.kits.accelerator import AcceleratorConformance
    from phalanx.testing.kits.callback import CallbackConformance
    from phalanx.testing.kits.checkpoint_io import CheckpointIOConformance
    from phalanx.testing.kits.environment import ClusterEnvironmentConformance
    from phalanx.testing.kits.logger import LoggerConformance
    from phalanx.testing.kits.precision import PrecisionConformance
    from phalanx.testing.processes import ScriptResult, run_command, run_script

#: public name -> the module that defines it.
_WHERE = {
    "START_METHODS_CHECKED": "phalanx.testing.conformance",
    "ScriptResult": "phalanx.testing.processes",
    "StrategyConformance": "phalanx.testing.conformance",
    "reference_run": "phalanx.testing.conformance",
    "run_command": "phalanx.testing.processes",
    "run_script": "phalanx.testing.processes",
    "AcceleratorConformance": "phalanx.testing.kits.accelerator",
    "CallbackConformance": "phalanx.testing.kits.callback",
    "CheckpointIOConformance": "phalanx.testing.kits.checkpoint_io",
    "ClusterEnvironmentConformance": "phalanx.testing.kits.environment",
    "LoggerConformance": "phalanx.testing.kits.logger",
    "PrecisionConformance": "phalanx.testing.kits.precision",
}

__all__ = [
    "START_METHODS_CHECKED",
    "AcceleratorConformance",
    "CallbackConformance",
    "CheckpointIOConformance",
    "ClusterEnvironmentConformance",
    "LoggerConformance",
    "PrecisionConformance",
    "ScriptResult",
    "StrategyConformance",
    "reference_run",
    "run_command",
    "run_script",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    msg = f"module 'phalanx.testing' has no attribute {name!r}"
    raise AttributeError(msg)
