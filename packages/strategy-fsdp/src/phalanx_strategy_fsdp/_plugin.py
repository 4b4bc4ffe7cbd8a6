"""The ``fsdp`` plugin's hook implementations: strategy names and checkpoint conversion.

Imports no torch: listing strategies runs these hooks and must stay fast. Targets are strings
resolved only when a strategy is selected; the conversion hook imports its worker on call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx import hookimpl

if TYPE_CHECKING:
    from phalanx.memory import MemoryEstimate, MemoryRequest
    from phalanx.registry import Registry

__all__ = ["phalanx_estimate_memory", "phalanx_register_strategies"]

_TARGET = "phalanx_strategy_fsdp.strategy:FSDPStrategy"
#: FSDP2's ``fully_shard`` and DTensor state dicts are public from torch 2.4 on.
_REQUIRES = ("torch>=2.4",)
#: name -> (description, init params)
_VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "fsdp": (
        "Fully sharded data parallel (FSDP2): parameters, gradients and optimizer state sharded over ranks",
        {},
    ),
    "fsdp_cpu_offload": (
        "Like 'fsdp', with sharded parameters, gradients and optimizer state kept in CPU memory",
        {"cpu_offload": True},
    ),
    "fsdp_no_reshard": (
        "Like 'fsdp', but parameters stay unsharded from forward to backward (less communication, more memory)",
        {"reshard_after_forward": False},
    ),
    "fsdp_shard_grad_op": (
        "Alias of 'fsdp_no_reshard' (FSDP1's SHARD_GRAD_OP)",
        {"reshard_after_forward": False},
    ),
    "fsdp_full_state_dict": (
        "Like 'fsdp', but checkpoints are one full file written by rank 0 instead of a sharded directory",
        {"state_dict_type": "full"},
    ),
    "hsdp": (
        "Hybrid sharding: replicate across nodes, shard within each node (2-D device mesh)",
        {"device_mesh": "hybrid"},
    ),
}


@hookimpl
def phalanx_register_strategies(registry: Registry) -> None:
    """Register every FSDP variant; all share one class and differ in init params."""
    for name, (description, params) in _VARIANTS.items():
        registry.register(name, _TARGET, description, requires=_REQUIRES, **params)


@hookimpl
def phalanx_estimate_memory(request: MemoryRequest) -> MemoryEstimate | None:
    """Every FSDP variant (and any name registered for FSDPStrategy): shards plus one gathered unit."""
    from phalanx_strategy_fsdp._memory import estimate

    return estimate(request)
