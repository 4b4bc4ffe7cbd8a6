"""DistributedDataParallel strategies for phalanx (``ddp``, ``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``).

``DDPStrategy`` is imported lazily so that discovering this plugin (which imports the package to
reach ``_plugin``) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["DDPStrategy"]

if TYPE_CHECKING:
    from phalanx_strategy_ddp.strategy import DDPStrategy


def __getattr__(name: str) -> Any:
    if name == "DDPStrategy":
        from phalanx_strategy_ddp.strategy import DDPStrategy

        return DDPStrategy
    msg = f"module 'phalanx_strategy_ddp' has no attribute {name!r}"
    raise AttributeError(msg)
