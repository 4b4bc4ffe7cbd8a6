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
    "phalanx_register_callbacks",
    "phalanx_register_checkpoint_io",
    "phalanx_register_cluster_environments",
    "phalanx_register_loggers",
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
    registry.register(
        "float8",
        "phalanx.precision.float8:Float8Precision",
        "float32 weights, Linear matmuls in float8 (torchao)",
        requires=("torchao",),
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
    registry.register("lsf", "phalanx.environments.lsf:LSFEnvironment", "Launched by jsrun in an LSF job")
    registry.register(
        "kubeflow",
        "phalanx.environments.kubeflow:KubeflowEnvironment",
        "A Kubeflow PyTorchJob replica (never detected: pass it in plugins=)",
    )


#: The built-in callbacks by name: (name, "module:Class" under phalanx.callbacks, description, requirements).
#: Names are the class names in snake_case; ``Trainer(callbacks=["early_stopping"])`` builds one with
#: Lightning's defaults (plus those in ``_CALLBACK_DEFAULTS``). A callback whose arguments have no
#: sensible default (LambdaCallback, BaseFinetuning, BasePredictionWriter, ThroughputMonitor's
#: ``batch_size_fn``) is not registered: pass an instance.
_CALLBACKS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("model_checkpoint", "model_checkpoint:ModelCheckpoint", "Save checkpoints; keep the best k and last", ()),
    ("early_stopping", "early_stopping:EarlyStopping", "Stop when val_loss stops improving (ranks agree)", ()),
    ("learning_rate_monitor", "lr_monitor:LearningRateMonitor", "Log each optimizer's learning rate", ()),
    ("model_summary", "model_summary:ModelSummary", "Print the layers and parameter counts at fit start", ()),
    ("rich_model_summary", "rich_model_summary:RichModelSummary", "ModelSummary as a rich table", ("rich>=12",)),
    ("tqdm_progress_bar", "progress:TQDMProgressBar", "Progress bars with tqdm", ()),
    ("rich_progress_bar", "rich_progress:RichProgressBar", "Progress bars with rich", ("rich>=12",)),
    ("timer", "timer:Timer", "Measure each stage's time; stop fit after a duration", ()),
    ("device_stats_monitor", "device_stats_monitor:DeviceStatsMonitor", "Log the accelerator's memory and use", ()),
    ("spike_detection", "spike_detection:SpikeDetection", "Stop on a loss spike (ranks agree)", ()),
    ("stochastic_weight_averaging", "stochastic_weight_avg:StochasticWeightAveraging", "SWA over the last epochs", ()),
    ("ema_weight_averaging", "weight_averaging:EMAWeightAveraging", "Exponential moving average of the weights", ()),
    ("on_exception_checkpoint", "on_exception_checkpoint:OnExceptionCheckpoint", "Checkpoint when fit raises", ()),
    ("learning_rate_finder", "lr_finder:LearningRateFinder", "Search a learning rate at fit start", ()),
    ("batch_size_finder", "batch_size_finder:BatchSizeFinder", "Search the largest batch size at fit start", ()),
)
_CALLBACK_DEFAULTS: dict[str, dict[str, Any]] = {
    "early_stopping": {"monitor": "val_loss"},
    "stochastic_weight_averaging": {"swa_lrs": 1e-2},
    "on_exception_checkpoint": {"dirpath": "checkpoints"},
}


@hookimpl
def phalanx_register_callbacks(registry: Registry) -> None:
    for name, target, description, requires in _CALLBACKS:
        params = _CALLBACK_DEFAULTS.get(name, {})
        registry.register(name, f"phalanx.callbacks.{target}", description, requires=requires, **params)


@hookimpl
def phalanx_register_loggers(registry: Registry) -> None:
    registry.register("csv", "phalanx.loggers.csv_logs:CSVLogger", "metrics.csv and hparams.yaml")
    registry.register(
        "tensorboard",
        "phalanx.loggers.tensorboard:TensorBoardLogger",
        "TensorBoard event files",
        requires=("tensorboard>=2.9",),
    )
    # No requirement line: both the mlflow and mlflow-skinny distributions provide the module.
    registry.register("mlflow", "phalanx.loggers.mlflow:MLFlowLogger", "An MLflow tracking store (file: or server)")
    registry.register("wandb", "phalanx.loggers.wandb:WandbLogger", "Weights & Biases runs", requires=("wandb>=0.16",))


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
        try:
            detected = environment.detect()
        except NotImplementedError:  # an environment only ever passed by hand (Kubeflow)
            continue
        if detected:
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
