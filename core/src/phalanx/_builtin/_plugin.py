"""Hook implementations for the core's built-in components.

Declared in core's pyproject as the entry point ``builtin``: the core loads its own defaults the
way it loads a vendor's package, so there is one discovery path. Targets are strings and nothing
heavy is imported at module level: listing must stay torch-free.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from phalanx import hookimpl
from phalanx.registry import Registry

if TYPE_CHECKING:
    from phalanx.memory import MemoryEstimate, MemoryRequest

__all__ = [
    "phalanx_convert_checkpoint",
    "phalanx_detect_cluster_environment",
    "phalanx_estimate_memory",
    "phalanx_register_accelerators",
    "phalanx_register_checkpoint_io",
    "phalanx_register_cluster_environments",
    "phalanx_register_precisions",
    "phalanx_register_strategies",
    "phalanx_select_accelerator",
    "phalanx_select_strategy",
]


@hookimpl
def phalanx_register_strategies(registry: Registry) -> None:
    registry.register(
        "single_device",
        "phalanx.strategies.single_device:SingleDeviceStrategy",
        "One process, one device: no communication at all",
    )


@hookimpl
def phalanx_register_accelerators(registry: Registry) -> None:
    registry.register("cpu", "phalanx.accelerators.cpu:CPUAccelerator", "CPU; devices counts processes")
    registry.register("cuda", "phalanx.accelerators.cuda:CUDAAccelerator", "NVIDIA GPUs through CUDA")
    registry.register("gpu", "phalanx.accelerators.cuda:CUDAAccelerator", "Alias of cuda")
    registry.register("mps", "phalanx.accelerators.mps:MPSAccelerator", "Apple silicon GPUs through MPS")


@hookimpl
def phalanx_register_precisions(registry: Registry) -> None:
    registry.register("32-true", "phalanx.precision.precision:Precision", "float32 weights and compute")
    registry.register("64-true", "phalanx.precision.double:DoublePrecision", "float64 weights and compute")
    registry.register(
        "16-mixed",
        "phalanx.precision.amp:MixedPrecision",
        "float32 weights, float16 autocast, gradient scaling",
        precision="16-mixed",
    )
    registry.register(
        "bf16-mixed",
        "phalanx.precision.amp:MixedPrecision",
        "float32 weights, bfloat16 autocast",
        precision="bf16-mixed",
    )
    registry.register(
        "16-true", "phalanx.precision.half:HalfPrecision", "float16 weights and compute", precision="16-true"
    )
    registry.register(
        "bf16-true", "phalanx.precision.half:HalfPrecision", "bfloat16 weights and compute", precision="bf16-true"
    )


@hookimpl
def phalanx_register_checkpoint_io(registry: Registry) -> None:
    registry.register("torch", "phalanx.checkpoint_io.torch_io:TorchCheckpointIO", "torch.save, atomic")
    registry.register("async", "phalanx.checkpoint_io.async_io:AsyncCheckpointIO", "torch.save on a background thread")


@hookimpl
def phalanx_register_cluster_environments(registry: Registry) -> None:
    registry.register("local", "phalanx.environments.local:LocalEnvironment", "This machine; phalanx launches")
    registry.register(
        "torchelastic", "phalanx.environments.torchelastic:TorchElasticEnvironment", "Launched by torchrun"
    )
    registry.register("slurm", "phalanx.environments.slurm:SLURMEnvironment", "Launched by srun in a SLURM job")


@hookimpl(trylast=True)
def phalanx_select_accelerator() -> str | None:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


@hookimpl(trylast=True)
def phalanx_select_strategy(accelerator: str, num_devices: int, num_nodes: int, interactive: bool) -> str | None:
    """One device: single_device. Several: ddp, or ddp_notebook where scripts cannot be re-run."""
    del accelerator
    if num_devices * num_nodes <= 1:
        return "single_device"
    return "ddp_notebook" if interactive else "ddp"


@hookimpl(trylast=True)
def phalanx_detect_cluster_environment() -> str | None:
    """The first registered environment (other than local) whose ``detect()`` is true."""
    from phalanx.registry import ClusterEnvironmentRegistry

    if os.environ.get("PHALANX_CLUSTER_ENVIRONMENT"):
        return os.environ["PHALANX_CLUSTER_ENVIRONMENT"]
    for entry in ClusterEnvironmentRegistry.entries():
        if entry.name == "local" or not entry.available:
            continue
        environment: Any = ClusterEnvironmentRegistry.get_class(entry.name)
        if environment.detect():
            return entry.name
    return "local"


@hookimpl(trylast=True)
def phalanx_convert_checkpoint(source: str, destination: str) -> bool | None:
    """Plain torch checkpoint files (single_device, ddp) are re-written in the portable format."""
    from phalanx._builtin._convert import convert_torch_file

    return convert_torch_file(source, destination)


@hookimpl(trylast=True)
def phalanx_estimate_memory(request: MemoryRequest) -> MemoryEstimate | None:
    """single_device: weights, gradients and optimizer state all on the one device."""
    from phalanx._builtin._memory import estimate

    return estimate(request)
