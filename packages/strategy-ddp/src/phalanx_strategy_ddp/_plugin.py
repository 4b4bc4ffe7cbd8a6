"""The ``ddp`` plugin's hook implementations: names, descriptions, and the "auto" choice.

Imports no torch: listing strategies runs these hooks, and must stay fast. Targets are strings
resolved only when a strategy is selected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx import hookimpl

if TYPE_CHECKING:
    from phalanx.memory import MemoryEstimate, MemoryRequest
    from phalanx.registry import Registry

__all__ = ["phalanx_estimate_memory", "phalanx_register_strategies", "phalanx_select_strategy"]

_TARGET = "phalanx_strategy_ddp.strategy:DDPStrategy"
_REQUIRES = ("torch>=2.1",)
#: name -> (start_method, how it launches, in words)
_VARIANTS = {
    "ddp": ("popen", "re-runs your script once per extra local rank (recommended for scripts)"),
    "ddp_spawn": ("spawn", "starts workers with torch.multiprocessing spawn; weights come back to the main process"),
    "ddp_fork": ("fork", "forks workers from the main process (fast start; Linux/macOS)"),
    "ddp_notebook": ("fork", "forks workers, so it works in Jupyter/IPython (Linux/macOS)"),
}
#: Accelerators DDP runs on; others (xla, ...) are left to their own plugins.
_DDP_ACCELERATORS = ("cpu", "cuda", "gpu")


@hookimpl
def phalanx_register_strategies(registry: Registry) -> None:
    """Register ddp, ddp_spawn, ddp_fork, ddp_notebook and their find_unused_parameters variants."""
    for name, (start_method, how) in _VARIANTS.items():
        registry.register(
            name,
            _TARGET,
            f"DistributedDataParallel, one process per device; {how}",
            requires=_REQUIRES,
            start_method=start_method,
        )
        for flag in (True, False):
            registry.register(
                f"{name}_find_unused_parameters_{str(flag).lower()}",
                _TARGET,
                f"Like {name!r} with find_unused_parameters={flag}; {how}",
                requires=_REQUIRES,
                start_method=start_method,
                find_unused_parameters=flag,
            )


@hookimpl
def phalanx_select_strategy(accelerator: str, num_devices: int, num_nodes: int, interactive: bool) -> str | None:
    """Several devices on cpu/cuda: ``ddp``, or ``ddp_notebook`` where the script cannot be re-run."""
    if accelerator not in _DDP_ACCELERATORS or num_devices * num_nodes <= 1:
        return None
    return "ddp_notebook" if interactive else "ddp"


@hookimpl
def phalanx_estimate_memory(request: MemoryRequest) -> MemoryEstimate | None:
    """Every ddp name (and any name registered for DDPStrategy): a replica plus gradient buckets."""
    from phalanx_strategy_ddp._memory import estimate

    return estimate(request)
