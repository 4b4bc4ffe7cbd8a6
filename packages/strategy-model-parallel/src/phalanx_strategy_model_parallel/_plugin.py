"""The ``model_parallel`` plugin's hook implementations: the strategy name and checkpoint conversion.

Imports no torch: listing strategies runs these hooks and must stay fast. The target is a string
resolved only when the strategy is selected; the conversion hook imports its worker on call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx import hookimpl

if TYPE_CHECKING:
    from phalanx.memory import MemoryEstimate, MemoryRequest
    from phalanx.registry import Registry

__all__ = ["phalanx_estimate_memory", "phalanx_register_strategies"]

_TARGET = "phalanx_strategy_model_parallel.strategy:ModelParallelStrategy"
#: DTensor tensor parallel, FSDP2 and torch.distributed.pipelining schedules are public from 2.6 on.
_REQUIRES = ("torch>=2.6",)


@hookimpl
def phalanx_register_strategies(registry: Registry) -> None:
    """Register ``model_parallel``: one class, sizes given by the user (or "auto")."""
    registry.register(
        "model_parallel",
        _TARGET,
        "Data x tensor x pipeline parallel on one DeviceMesh (FSDP2 + DTensor TP + pipelining schedules)",
        requires=_REQUIRES,
    )


@hookimpl
def phalanx_estimate_memory(request: MemoryRequest) -> MemoryEstimate | None:
    """model_parallel: weights, gradients and state divided over the dp x tp x pp mesh."""
    from phalanx_strategy_model_parallel._memory import estimate

    return estimate(request)
