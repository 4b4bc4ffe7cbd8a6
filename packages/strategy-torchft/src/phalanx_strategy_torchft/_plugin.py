"""The ``torchft`` plugin's hook implementations: the ``ft_ddp``, ``ft_hsdp`` and ``ft_diloco`` names and their requirements.

Imports no torch and no torchft: listing strategies runs these hooks and must stay fast, and a
machine without torchft must still list every name (as unavailable, with the pip command that
fixes it). The target is a string resolved only when the strategy is selected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx import hookimpl

if TYPE_CHECKING:
    from phalanx.memory import MemoryEstimate, MemoryRequest
    from phalanx.registry import Registry

__all__ = ["phalanx_estimate_memory", "phalanx_register_strategies"]

TARGET = "phalanx_strategy_torchft.strategy:FTDDPStrategy"
HSDP_TARGET = "phalanx_strategy_torchft.hsdp:FTHSDPStrategy"
DILOCO_TARGET = "phalanx_strategy_torchft.diloco:FTDiLoCoStrategy"
REQUIRES = ("torch>=2.7", "torchft>=0.2")


@hookimpl
def phalanx_register_strategies(registry: Registry) -> None:
    """Register ``ft_ddp``, ``ft_hsdp`` and ``ft_diloco``: replica groups that fail and heal without stopping the job."""
    registry.register(
        "ft_ddp",
        TARGET,
        "torchft fault-tolerant data parallel: replica groups (DDP inside) keep training when one dies; "
        "a restarted group heals from a live peer",
        requires=REQUIRES,
    )
    registry.register(
        "ft_hsdp",
        HSDP_TARGET,
        "torchft fault-tolerant HSDP: FSDP2 shards inside each replica group, torchft's fault-tolerant "
        "all-reduce across groups; a restarted group heals rank by rank from a live peer",
        requires=REQUIRES,
    )
    registry.register(
        "ft_diloco",
        DILOCO_TARGET,
        "torchft fault-tolerant DiLoCo: replica groups train apart (DDP inside) and average their "
        "pseudo-gradients every sync_every steps for an outer optimizer step; streaming fragments",
        requires=REQUIRES,
    )


@hookimpl
def phalanx_estimate_memory(request: MemoryRequest) -> MemoryEstimate | None:
    """``ft_ddp`` holds a full replica per rank (like ddp) plus the buckets; ``ft_hsdp`` a shard (like fsdp);
    ``ft_diloco`` ft_ddp's replica plus the global weights (in host memory) and the outer optimizer state."""
    from phalanx_strategy_torchft._memory import estimate

    return estimate(request)
