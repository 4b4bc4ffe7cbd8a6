"""Interpret what a Module's ``configure_optimizers`` returns.

Lightning lets ``configure_optimizers`` return several shapes (one optimizer, a list, a pair of
lists, a dict, a list of dicts). Users port their modules unchanged, so phalanx accepts exactly the
same shapes and turns them into one canonical form: a list of optimizers and a list of
:class:`LRSchedulerConfig`. Anything else fails here, at setup, with a message showing the accepted
shapes, rather than deep inside the training loop.

Public because a strategy that owns its optimizers (DeepSpeed builds its engine from them) must
parse ``configure_optimizers`` exactly as the core does, and one that offloads or restores
optimizer state needs :func:`optimizers_to_device`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from phalanx._module_hooks import ModuleHooks
from phalanx.errors import MisconfigurationError, closest_match
from phalanx.utilities.model_helpers import is_overridden
from phalanx.utilities.rank_zero import rank_zero_warn

__all__ = ["LRSchedulerConfig", "init_optimizers_and_lr_schedulers", "optimizers_to_device"]

_INTERVALS = ("epoch", "step")
_OPTIMIZER_DICT_KEYS = ("optimizer", "lr_scheduler", "monitor")
_SCHEDULER_DICT_KEYS = ("scheduler", "interval", "frequency", "monitor", "name", "strict")
#: Keys that only tell the Trainer how to step a scheduler; manual optimization steps its own.
_MANUAL_IGNORED_KEYS = ("monitor", "strict")
_ACCEPTED_SHAPES = (
    "an Optimizer; a list/tuple of Optimizers; a pair ([optimizers], [schedulers]); "
    'a dict {"optimizer": opt, "lr_scheduler": scheduler or {"scheduler": ..., "interval": ..., '
    '"frequency": ..., "monitor": ...}}; a list/tuple of such dicts; or None (no optimizer)'
)


@dataclass
class LRSchedulerConfig:
    """How and when the Trainer steps one learning-rate scheduler.

    Attributes:
        scheduler: The scheduler object (anything with a ``step`` method).
        interval: ``"epoch"`` steps it after each epoch, ``"step"`` after each optimizer step.
        frequency: Step it every ``frequency`` intervals.
        monitor: Metric passed to ``ReduceLROnPlateau.step``; required for that scheduler.
        name: Name used when logging the learning rate; ``None`` lets the logger pick one.
        strict: Whether a missing ``monitor`` metric is an error (True) or skipped with a warning.
    """

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None
    strict: bool = True

    def __post_init__(self) -> None:
        if self.interval not in _INTERVALS:
            msg = (
                f"lr scheduler interval={self.interval!r} is not supported; valid values are "
                f"{list(_INTERVALS)}. Return 'interval': 'epoch' or 'step' from configure_optimizers."
            )
            raise MisconfigurationError(msg)
        if isinstance(self.frequency, bool) or not isinstance(self.frequency, int) or self.frequency < 1:
            msg = (
                f"lr scheduler frequency={self.frequency!r} is not supported; it must be an int >= 1. "
                "Return e.g. 'frequency': 1 from configure_optimizers."
            )
            raise MisconfigurationError(msg)

    @property
    def reduce_on_plateau(self) -> bool:
        """Whether the scheduler needs the monitored metric value passed to ``step``."""
        return isinstance(self.scheduler, ReduceLROnPlateau)


def _check_keys(given: Mapping[str, Any], valid: Sequence[str], what: str) -> None:
    for key in given:
        if key not in valid:
            hint = closest_match(str(key), valid)
            suggestion = f" Did you mean {hint!r}?" if hint else ""
            msg = (
                f"Unknown key {key!r} in the {what} returned by configure_optimizers; valid keys are "
                f"{list(valid)}.{suggestion} Rename or remove the key."
            )
            raise MisconfigurationError(msg)


def _scheduler_config(scheduler: Any, monitor: str | None = None, *, manual: bool = False) -> LRSchedulerConfig:
    if manual:
        # Manual optimization steps its schedulers itself: how the Trainer would step one means
        # nothing (a warning says so, as in Lightning); ``interval`` stays, LearningRateMonitor reads it.
        if not isinstance(scheduler, Mapping):
            return LRSchedulerConfig(scheduler=scheduler)
        _check_keys(scheduler, _SCHEDULER_DICT_KEYS, "lr scheduler dict")
        ignored = [key for key in scheduler if key in _MANUAL_IGNORED_KEYS]
        if ignored:
            rank_zero_warn(
                f"The lr scheduler dict contains the key(s) {ignored}, but the keys will be ignored. You need to "
                "call `lr_scheduler.step()` manually in manual optimization.",
                category=RuntimeWarning,
            )
        scheduler = {key: value for key, value in scheduler.items() if key not in _MANUAL_IGNORED_KEYS}
        monitor = None
    if isinstance(scheduler, Mapping):
        _check_keys(scheduler, _SCHEDULER_DICT_KEYS, "lr scheduler dict")
        if "scheduler" not in scheduler:
            msg = (
                f"The lr scheduler dict {dict(scheduler)!r} has no 'scheduler' key; add "
                "'scheduler': <your scheduler> to it."
            )
            raise MisconfigurationError(msg)
        options = dict(scheduler)
        options.setdefault("monitor", monitor)
        config = LRSchedulerConfig(**options)
    else:
        config = LRSchedulerConfig(scheduler=scheduler, monitor=monitor)
    if config.reduce_on_plateau and config.monitor is None and not manual:
        msg = (
            "ReduceLROnPlateau needs a metric to monitor, but configure_optimizers gave none; return "
            '{"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "val_loss"}}.'
        )
        raise MisconfigurationError(msg)
    return config


def _from_optimizer_dict(
    config: Mapping[str, Any], *, manual: bool = False
) -> tuple[Optimizer, LRSchedulerConfig | None]:
    _check_keys(config, _OPTIMIZER_DICT_KEYS, "optimizer dict")
    optimizer = config.get("optimizer")
    if not isinstance(optimizer, Optimizer):
        msg = (
            f"The dict returned by configure_optimizers has 'optimizer'={optimizer!r} "
            f"(type {type(optimizer).__name__}); it must be a torch.optim.Optimizer."
        )
        raise MisconfigurationError(msg)
    scheduler = config.get("lr_scheduler")
    if scheduler is None:
        return optimizer, None
    return optimizer, _scheduler_config(scheduler, config.get("monitor"), manual=manual)


def _parse(result: Any, *, manual: bool = False) -> tuple[list[Optimizer], list[LRSchedulerConfig]]:
    if result is None:
        return [], []
    if isinstance(result, Optimizer):
        return [result], []
    if isinstance(result, Mapping):
        optimizer, config = _from_optimizer_dict(result, manual=manual)
        return [optimizer], [config] if config is not None else []
    if isinstance(result, (list, tuple)):
        items = list(result)
        if all(isinstance(item, Optimizer) for item in items):
            return items, []
        if all(isinstance(item, Mapping) for item in items):
            pairs = [_from_optimizer_dict(item, manual=manual) for item in items]
            return [opt for opt, _ in pairs], [cfg for _, cfg in pairs if cfg is not None]
        if len(items) == 2 and all(isinstance(item, (list, tuple)) for item in items):
            optimizers, schedulers = list(items[0]), list(items[1])
            bad = [opt for opt in optimizers if not isinstance(opt, Optimizer)]
            if bad:
                msg = (
                    f"The first list returned by configure_optimizers contains {bad[0]!r} "
                    f"(type {type(bad[0]).__name__}), which is not a torch.optim.Optimizer. "
                    f"Accepted shapes: {_ACCEPTED_SHAPES}."
                )
                raise MisconfigurationError(msg)
            return optimizers, [_scheduler_config(item, manual=manual) for item in schedulers]
    msg = (
        f"configure_optimizers returned {result!r} (type {type(result).__name__}), which phalanx "
        f"cannot interpret. Accepted shapes: {_ACCEPTED_SHAPES}."
    )
    raise MisconfigurationError(msg)


def _check_scheduler_optimizers(optimizers: list[Optimizer], configs: list[LRSchedulerConfig]) -> None:
    known = {id(opt) for opt in optimizers}
    for config in configs:
        owner = getattr(config.scheduler, "optimizer", None)
        if owner is not None and id(owner) not in known:
            msg = (
                f"lr scheduler {type(config.scheduler).__name__} wraps an optimizer "
                f"({type(owner).__name__}) that configure_optimizers did not return; return that "
                "optimizer too, or build the scheduler on one of the returned optimizers."
            )
            raise MisconfigurationError(msg)


def _check_scheduler_api(configs: list[LRSchedulerConfig], module: Any, *, manual: bool) -> None:
    """Schedulers are checkpointed, so each needs ``state_dict``; the Trainer steps them only in automatic mode."""
    for config in configs:
        scheduler = config.scheduler
        name = type(scheduler).__name__
        if not (
            callable(getattr(scheduler, "state_dict", None)) and callable(getattr(scheduler, "load_state_dict", None))
        ):
            msg = (
                f"The provided lr scheduler `{name}` is invalid: it has no state_dict() and load_state_dict() "
                "methods, which checkpointing needs. Use a torch.optim.lr_scheduler class or add both methods."
            )
            raise TypeError(msg)
        if manual or isinstance(scheduler, (LRScheduler, ReduceLROnPlateau)):
            continue
        custom_step = hasattr(module, "lr_scheduler_step") and is_overridden("lr_scheduler_step", module, ModuleHooks)
        if not custom_step:
            msg = (
                f"The provided lr scheduler `{name}` doesn't follow PyTorch's LRScheduler API, so the Trainer "
                "cannot step it; override `Module.lr_scheduler_step(scheduler, metric)` to step it yourself."
            )
            raise MisconfigurationError(msg)


def _check_multiple_optimizers(module: Any, optimizers: list[Optimizer], *, manual: bool) -> None:
    """Automatic optimization steps one optimizer per batch; several (a GAN) need manual optimization."""
    training_step = getattr(module, "training_step", None)
    if training_step is not None:
        try:
            parameters = inspect.signature(training_step).parameters
        except (TypeError, ValueError):
            parameters = {}  # type: ignore[assignment]
        if "optimizer_idx" in parameters:
            msg = (
                "Training with multiple optimizers is only supported with manual optimization. Remove the "
                "`optimizer_idx` argument from `training_step`, set `self.automatic_optimization = False` and "
                "access your optimizers in `training_step` with `opt1, opt2, ... = self.optimizers()`."
            )
            raise RuntimeError(msg)
    if not manual and len(optimizers) > 1:
        msg = (
            f"configure_optimizers returned {len(optimizers)} optimizers, but training with multiple optimizers "
            "is only supported with manual optimization. Set `self.automatic_optimization = False`, then access "
            "your optimizers in `training_step` with `opt1, opt2, ... = self.optimizers()`."
        )
        raise RuntimeError(msg)


def init_optimizers_and_lr_schedulers(module: Any) -> tuple[list[Optimizer], list[LRSchedulerConfig]]:
    """Call ``module.configure_optimizers()`` and normalise its result.

    Args:
        module: The (unwrapped) Module; it must define ``configure_optimizers``.

    Returns:
        ``(optimizers, lr_scheduler_configs)``. Both lists are empty when the module returned
        ``None`` (e.g. a module only used for evaluation, or one that steps optimizers by hand).

    Raises:
        MisconfigurationError: The module has no ``configure_optimizers`` or returned a shape that
            is not one of the accepted ones.
    """
    configure = getattr(module, "configure_optimizers", None)
    if not callable(configure):
        msg = (
            f"{type(module).__name__} has no configure_optimizers() method, which training needs; "
            "define configure_optimizers(self) returning e.g. torch.optim.SGD(self.parameters(), lr=0.1)."
        )
        raise MisconfigurationError(msg)
    manual = not getattr(module, "automatic_optimization", True)
    optimizers, configs = _parse(configure(), manual=manual)
    _check_multiple_optimizers(module, optimizers, manual=manual)
    _check_scheduler_optimizers(optimizers, configs)
    _check_scheduler_api(configs, module, manual=manual)
    return optimizers, configs


def optimizers_to_device(optimizers: list[Optimizer], device: torch.device | str) -> None:
    """Move optimizer state (e.g. Adam moments restored on CPU) next to the parameters, in place.

    ``step`` counters are left where torch put them: on CPU unless the optimizer is capturable or
    fused, and torch checks that placement.
    """
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for key, value in state.items():
                if key != "step" and isinstance(value, torch.Tensor):
                    state[key] = value.to(device)
