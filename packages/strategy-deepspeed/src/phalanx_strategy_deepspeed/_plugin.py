"""The ``deepspeed`` plugin's hook implementations: strategy names and checkpoint conversion.

Imports neither torch nor deepspeed: ``phalanx strategies`` runs these hooks to list names, and
listing must stay fast and work where deepspeed is missing (the names are then shown as
unavailable, with the ``requires`` reason). Targets are strings resolved only on selection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx import hookimpl

if TYPE_CHECKING:
    from phalanx.memory import MemoryEstimate, MemoryRequest
    from phalanx.registry import Registry

__all__ = [
    "STRATEGY_NAMES",
    "phalanx_convert_checkpoint",
    "phalanx_estimate_memory",
    "phalanx_register_cluster_environments",
    "phalanx_register_strategies",
]

_TARGET = "phalanx_strategy_deepspeed.strategy:DeepSpeedStrategy"
_REQUIRES = ("deepspeed>=0.14",)

#: name -> (description, init params). Mirrors Lightning's names so scripts port unchanged.
STRATEGY_NAMES: dict[str, tuple[str, dict[str, Any]]] = {
    "deepspeed": ("DeepSpeed ZeRO stage 2 (or what `config` says): optimizer state and gradients sharded", {}),
    "deepspeed_stage_1": ("DeepSpeed ZeRO stage 1: optimizer state sharded across ranks", {"stage": 1}),
    "deepspeed_stage_1_offload": (
        "DeepSpeed ZeRO stage 1 with optimizer state offloaded to CPU memory",
        {"stage": 1, "offload_optimizer": True},
    ),
    "deepspeed_stage_2": ("DeepSpeed ZeRO stage 2: optimizer state and gradients sharded", {"stage": 2}),
    "deepspeed_stage_2_offload": (
        "DeepSpeed ZeRO stage 2 with optimizer state offloaded to CPU memory",
        {"stage": 2, "offload_optimizer": True},
    ),
    "deepspeed_stage_3": ("DeepSpeed ZeRO stage 3: parameters, gradients and optimizer state sharded", {"stage": 3}),
    "deepspeed_stage_3_offload": (
        "DeepSpeed ZeRO stage 3 with parameters and optimizer state offloaded to CPU memory",
        {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
    ),
    "deepspeed_stage_3_offload_nvme": (
        "DeepSpeed ZeRO stage 3 with parameters and optimizer state offloaded to NVMe (needs nvme_path)",
        {
            "stage": 3,
            "offload_optimizer": True,
            "offload_parameters": True,
            "remote_device": "nvme",
            "offload_params_device": "nvme",
            "offload_optimizer_device": "nvme",
        },
    ),
}


@hookimpl
def phalanx_register_strategies(registry: Registry) -> None:
    """Register ``deepspeed`` and its ``deepspeed_stage_*`` presets."""
    for name, (description, params) in STRATEGY_NAMES.items():
        registry.register(name, _TARGET, description, requires=_REQUIRES, **params)


@hookimpl
def phalanx_register_cluster_environments(registry: Registry) -> None:
    """Register the environment of ranks started by the ``deepspeed`` command-line launcher."""
    registry.register(
        "deepspeed_launcher",
        "phalanx_strategy_deepspeed.environment:DeepSpeedLauncherEnvironment",
        "Launched by the `deepspeed` command (RANK, LOCAL_RANK, CROSS_RANK, ...)",
        requires=_REQUIRES,
    )


@hookimpl
def phalanx_convert_checkpoint(source: str, destination: str) -> bool | None:
    """Consolidate a DeepSpeed checkpoint directory into one fp32 file; pass on anything else.

    The check for "is this ours" reads only the directory listing, so other plugins' formats are
    passed on without importing torch or deepspeed.
    """
    from phalanx_strategy_deepspeed._layout import is_deepspeed_checkpoint

    if not is_deepspeed_checkpoint(source):
        return None
    from phalanx_strategy_deepspeed._convert import convert_deepspeed_checkpoint

    convert_deepspeed_checkpoint(source, destination)
    return True


@hookimpl
def phalanx_estimate_memory(request: MemoryRequest) -> MemoryEstimate | None:
    """Every ZeRO stage and offload preset (and any name registered for DeepSpeedStrategy)."""
    from phalanx_strategy_deepspeed._memory import estimate

    return estimate(request)
