"""DeepSpeed ZeRO strategies for phalanx (``deepspeed``, ``deepspeed_stage_{1,2,3}[_offload]``, ...).

``DeepSpeedStrategy`` is imported lazily: discovering this plugin imports the package to reach
``_plugin``, and that must import neither torch nor deepspeed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["DeepSpeedLauncherEnvironment", "DeepSpeedPrecision", "DeepSpeedStrategy"]

if TYPE_CHECKING:
    from phalanx_strategy_deepspeed._precision import DeepSpeedPrecision
    from phalanx_strategy_deepspeed.environment import DeepSpeedLauncherEnvironment
    from phalanx_strategy_deepspeed.strategy import DeepSpeedStrategy

_LAZY = {
    "DeepSpeedStrategy": "phalanx_strategy_deepspeed.strategy",
    "DeepSpeedPrecision": "phalanx_strategy_deepspeed._precision",
    "DeepSpeedLauncherEnvironment": "phalanx_strategy_deepspeed.environment",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module 'phalanx_strategy_deepspeed' has no attribute {name!r}"
    raise AttributeError(msg)
