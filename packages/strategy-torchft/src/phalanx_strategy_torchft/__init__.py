"""Fault-tolerant replica groups for phalanx with torchft (``ft_ddp``, ``ft_hsdp``, ``ft_diloco``).

The strategy classes are imported lazily so that discovering this plugin (which imports the package to
reach ``_plugin``) imports neither torch nor torchft.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["FTDDPStrategy", "FTDiLoCoStrategy", "FTHSDPStrategy"]

if TYPE_CHECKING:
    from phalanx_strategy_torchft.diloco import FTDiLoCoStrategy
    from phalanx_strategy_torchft.hsdp import FTHSDPStrategy
    from phalanx_strategy_torchft.strategy import FTDDPStrategy


def __getattr__(name: str) -> Any:
    if name == "FTDDPStrategy":
        from phalanx_strategy_torchft.strategy import FTDDPStrategy

        return FTDDPStrategy
    if name == "FTDiLoCoStrategy":
        from phalanx_strategy_torchft.diloco import FTDiLoCoStrategy

        return FTDiLoCoStrategy
    if name == "FTHSDPStrategy":
        from phalanx_strategy_torchft.hsdp import FTHSDPStrategy

        return FTHSDPStrategy
    msg = f"module 'phalanx_strategy_torchft' has no attribute {name!r}"
    raise AttributeError(msg)
