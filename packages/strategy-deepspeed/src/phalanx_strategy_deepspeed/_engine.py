"""What DeepSpeedStrategy hands to ``deepspeed.initialize``: optimizer, scheduler, batch size, config.

Kept apart from the strategy so the strategy file stays about the lifecycle. DeepSpeed's engine
steps exactly one optimizer; the scheduler is given to the engine (so DeepSpeed can wrap it) and
then taken back, so that the Trainer keeps stepping it with the Module's ``interval`` and
``frequency``, as with every other strategy.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from phalanx.errors import MisconfigurationError
from phalanx.utilities import LRSchedulerConfig, init_optimizers_and_lr_schedulers

__all__ = ["adopt_scheduler", "auto_batch_size", "client_optimizer", "inference_config"]


def auto_batch_size(trainer: Any) -> int | None:
    """The train dataloader's batch size (DeepSpeed's ``train_micro_batch_size_per_gpu``)."""
    candidates = (getattr(getattr(trainer, "fit_loop", None), "dataloader", None), getattr(trainer, "train_dataloader", None))
    for loader in candidates:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None) or getattr(loader, "batch_size", None)
        if isinstance(size, int) and size > 0:
            return size
    return None


def inference_config(config: dict[str, Any], *, stage3: bool) -> dict[str, Any]:
    """A config for evaluation: no optimizer; ZeRO kept only for stage 3 (the weights are sharded)."""
    keep: dict[str, Any] = {key: config[key] for key in ("fp16", "bf16", "train_micro_batch_size_per_gpu") if key in config}
    keep.setdefault("train_micro_batch_size_per_gpu", 1)
    if stage3:
        keep["zero_optimization"] = config["zero_optimization"]
        keep["zero_allow_untested_optimizer"] = config.get("zero_allow_untested_optimizer", True)
    return keep


def client_optimizer(module: nn.Module, config: dict[str, Any]) -> tuple[Any, list[LRSchedulerConfig]]:
    """The Module's optimizer and schedulers; no optimizer when the DeepSpeed config defines one.

    Raises:
        MisconfigurationError: No optimizer anywhere, more than one, or more than one scheduler.
    """
    optimizers, schedulers = init_optimizers_and_lr_schedulers(module)
    if len(schedulers) > 1:
        msg = (
            f"DeepSpeed steps one LR scheduler, but configure_optimizers returned {len(schedulers)}. "
            "Fix: return one scheduler (or none)."
        )
        raise MisconfigurationError(msg)
    if "optimizer" in config:
        return None, schedulers
    if len(optimizers) != 1:
        msg = (
            f"DeepSpeed trains with exactly one optimizer, but configure_optimizers returned {len(optimizers)}. "
            "Fix: return one optimizer, or define one in the DeepSpeed config ('optimizer': {...})."
        )
        raise MisconfigurationError(msg)
    return optimizers[0], schedulers


def adopt_scheduler(engine: Any, ds_scheduler: Any, schedulers: list[LRSchedulerConfig]) -> list[LRSchedulerConfig]:
    """Take the scheduler back from the engine, so the Trainer steps it (``interval``/``frequency`` hold)."""
    if ds_scheduler is None:
        return schedulers
    engine.lr_scheduler = None
    if not schedulers:
        return [LRSchedulerConfig(ds_scheduler, interval="step")]
    schedulers[0].scheduler = ds_scheduler
    return schedulers


def release_engine(engine: Any, module: nn.Module, *, gather: bool) -> None:
    """Detach ``module`` from a ZeRO-3 engine at teardown, with its full weights back when ``gather``.

    Under stage 3 the Module's parameters are empty shells whose data lives in per-rank partitions
    tied to this run's process group, which teardown destroys. Gathering (one submodule at a time,
    a collective) and replacing each parameter by a plain one gives the Module its trained weights,
    as after any other strategy; the engine's hooks are removed so the Module runs on its own.
    """
    if gather:
        from phalanx_strategy_deepspeed._runtime import import_deepspeed

        deepspeed = import_deepspeed()
        for sub in module.modules():
            params = list(sub.named_parameters(recurse=False))
            if not params:
                continue
            with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
                full = {name: p.data.detach().clone() for name, p in params}
            sub._parameters = dict(sub._parameters.items())  # DeepSpeed's gathering dict -> a plain one
            for name, param in params:
                sub._parameters[name] = nn.Parameter(full[name], requires_grad=param.requires_grad)
    destroy = getattr(engine, "destroy", None)
    if callable(destroy):
        destroy()


def stale_partitions(module: nn.Module) -> list[str]:
    """Names of parameters partitioned by a ZeRO-3 run whose process group no longer exists."""
    import torch.distributed as dist

    stale = []
    for name, param in module.named_parameters():
        group = getattr(param, "ds_process_group", None)
        if not hasattr(param, "ds_id") or group is None:
            continue
        try:
            if not dist.is_initialized():
                raise ValueError
            dist.get_rank(group=group)
        except (ValueError, RuntimeError):
            stale.append(name)
    return stale
