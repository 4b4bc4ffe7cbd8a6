"""LearningRateMonitor: send each optimizer's learning rate (and optionally momentum and weight decay) to the loggers.

A scheduler changes the learning rate behind the user's back, so a run's logs are hard to read
without the rate itself next to the loss. The callback reads the rates from the optimizers'
param groups, through ``trainer.optimizers`` and ``trainer.lr_scheduler_configs`` only, and sends
them to every logger under Lightning's key names, so dashboards and scripts built on Lightning's
``lr-SGD`` / ``lr-Adam/pg2`` columns keep working.

When the rates are read follows the schedulers: a scheduler stepped every optimizer step is read
before training batches (every ``log_every_n_steps``), one stepped every epoch at the start of
each epoch; ``logging_interval`` forces one of the two for all of them. Optimizers without a
scheduler are read at both points. Every rank reads the values (so :attr:`lrs` agrees
everywhere); only global rank 0 hands them to the loggers, which write files.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import torch

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["LearningRateMonitor"]

_INTERVALS = (None, "step", "epoch")


class LearningRateMonitor(Callback):
    """Log the learning rate of every optimizer param group while fitting.

    Keys follow Lightning: ``lr-<OptimizerClass>`` (``lr-<name>`` when the scheduler config has a
    ``name``); a second, third... optimizer of the same class gets ``-1``, ``-2``...; an optimizer
    with several param groups gets ``/pg1``, ``/pg2``... (or ``/<group name>`` for groups with a
    ``"name"``). Momentum goes under ``<key>-momentum`` (``betas[0]`` for Adam-like optimizers, 0
    when the optimizer has none) and weight decay under ``<key>-weight_decay``.

    Args:
        logging_interval: ``"step"`` logs before training batches, ``"epoch"`` at epoch starts,
            None follows each scheduler's own ``interval``.
        log_momentum: Also log each param group's momentum.
        log_weight_decay: Also log each param group's weight decay.

    Attributes:
        lrs: Every learning rate read so far, per key, in order.
        last_momentum_values: The latest momentum per ``<key>-momentum`` (None before the first read).
        last_weight_decay_values: The latest weight decay per ``<key>-weight_decay``.

    Raises:
        MisconfigurationError: ``logging_interval`` is not None, ``"step"`` or ``"epoch"``; the
            Trainer has no logger when fit starts; or one optimizer has two param groups with
            the same ``"name"``.
    """

    def __init__(
        self,
        logging_interval: str | None = None,
        log_momentum: bool = False,
        log_weight_decay: bool = False,
    ) -> None:
        if logging_interval not in _INTERVALS:
            msg = (
                f"LearningRateMonitor(logging_interval={logging_interval!r}) is invalid; valid values are "
                f"{list(_INTERVALS)}. Fix: pass 'step' to log before training batches, 'epoch' to log at "
                "epoch starts, or None to follow each scheduler's interval."
            )
            raise MisconfigurationError(msg)
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}
        self._stepped_batches = 0  # training batches that ran an optimizer step (the logging cadence)
        self._step_before_batch = 0

    # ------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Fail before any training when nothing would receive the values."""
        if not trainer.loggers:
            msg = (
                "LearningRateMonitor cannot run with a `Trainer` that has no logger (logger=False or an empty "
                "list). Fix: pass logger=True or a logger, e.g. Trainer(logger=CSVLogger('logs')), or "
                "remove the LearningRateMonitor callback."
            )
            raise MisconfigurationError(msg)

    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Name every param group now, so :attr:`lrs` lists all keys before the first value."""
        if self.log_momentum and not self._all_have_momentum(trainer):
            rank_zero_warn(
                "LearningRateMonitor(log_momentum=True): some optimizers do not have momentum. They have "
                "neither 'momentum' nor 'betas', so 0 is logged for them.",
                category=RuntimeWarning,
            )
        keys = [key for _, group_keys, _ in self._keyed_optimizers(trainer) for key in group_keys]
        self.lrs = {key: [] for key in keys}
        self.last_momentum_values = {f"{key}-momentum": None for key in keys}
        self.last_weight_decay_values = {f"{key}-weight_decay": None for key in keys}
        self._stepped_batches = trainer.global_step

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Count the batches that stepped (with two optimizers stepped per batch, one batch, not two steps)."""
        if trainer.global_step != self._step_before_batch:
            self._stepped_batches += 1

    def on_train_batch_start(self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int) -> None:
        """Log step-interval rates every ``log_every_n_steps`` (and on the batch where fit stops)."""
        self._step_before_batch = trainer.global_step
        if self.logging_interval == "epoch" or not self._logs_this_step(trainer):
            return
        self._log(trainer, "step" if self.logging_interval is None else None)

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Log epoch-interval rates at the start of each epoch."""
        if self.logging_interval == "step":
            return
        self._log(trainer, "epoch" if self.logging_interval is None else None)

    # ------------------------------------------------------------------ reading and sending
    def _logs_this_step(self, trainer: TrainerView) -> bool:
        """Lightning's rule: the batch about to run is the ``log_every_n_steps``-th to step, or fit stops.

        Batches are counted, not optimizer steps, so two optimizers stepping in every batch log as
        often as one.
        """
        every = trainer.log_every_n_steps
        if every <= 0:
            return False
        return (self._stepped_batches + 1) % every == 0 or trainer.should_stop

    def _log(self, trainer: TrainerView, interval: str | None) -> None:
        """Read the optimizers whose scheduler runs on ``interval`` (None: all) and send the values."""
        stats: dict[str, float] = {}
        for optimizer, keys, scheduler_interval in self._keyed_optimizers(trainer):
            if scheduler_interval is not None and interval is not None and scheduler_interval != interval:
                continue
            self._adopt_keys(keys)
            stats.update(self._read(optimizer, keys))
        if not stats:
            return
        # as in Lightning, the values are also metrics other callbacks can monitor (EarlyStopping on
        # "lr-SGD"); every rank has them, so decisions on them agree
        device = trainer.strategy.root_device
        trainer.callback_metrics.update({key: torch.tensor(value, device=device) for key, value in stats.items()})
        if trainer.fast_dev_run or not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            logger.log_metrics(stats, step=trainer.global_step)

    def _read(self, optimizer: Any, keys: list[str]) -> dict[str, float]:
        stats: dict[str, float] = {}
        betas = "betas" in getattr(optimizer, "defaults", {})
        for group, key in zip(optimizer.param_groups, keys, strict=True):
            lr = float(group["lr"])
            self.lrs[key].append(lr)
            stats[key] = lr
            if self.log_momentum:
                momentum = float(group["betas"][0] if betas else group.get("momentum", 0.0))
                self.last_momentum_values[f"{key}-momentum"] = momentum
                stats[f"{key}-momentum"] = momentum
            if self.log_weight_decay:
                decay = float(group.get("weight_decay", 0.0))
                self.last_weight_decay_values[f"{key}-weight_decay"] = decay
                stats[f"{key}-weight_decay"] = decay
        return stats

    def _adopt_keys(self, keys: list[str]) -> None:
        """Give new keys a history; an optimizer that grew a second group moves ``key`` to ``key/pg1``."""
        for key in keys:
            if key in self.lrs:
                continue
            old = key.replace("/pg1", "")
            self.lrs[key] = self.lrs.pop(old) if key.endswith("/pg1") and old in self.lrs else []

    # ------------------------------------------------------------------ naming
    def _keyed_optimizers(self, trainer: TrainerView) -> list[tuple[Any, list[str], str | None]]:
        """``(optimizer, key per param group, scheduler interval or None)`` for every optimizer.

        Scheduled optimizers come first, in scheduler order, then the remaining ones. The class
        counter that numbers duplicates counts unnamed schedulers and unscheduled optimizers only,
        and a named scheduler still takes the current count as suffix, as Lightning names them.
        """
        seen: list[Any] = []
        classes: Counter[type] = Counter()
        keyed: list[tuple[Any, list[str], str | None]] = []
        for config in trainer.lr_scheduler_configs:
            optimizer = config.scheduler.optimizer
            name = config.name
            if name is None:
                classes[type(optimizer)] += 1
            base = name if name is not None else f"lr-{type(optimizer).__name__}"
            keyed.append((optimizer, self._group_keys(optimizer, base, classes), config.interval))
            seen.append(optimizer)
        for wrapped in trainer.optimizers:
            optimizer = getattr(wrapped, "optimizer", wrapped)  # wrappers (DeepSpeed) hold the torch optimizer
            if any(optimizer is other for other in seen):
                continue
            classes[type(optimizer)] += 1
            keyed.append((optimizer, self._group_keys(optimizer, f"lr-{type(optimizer).__name__}", classes), None))
            seen.append(optimizer)
        return keyed

    @staticmethod
    def _group_keys(optimizer: Any, base: str, classes: Counter[type]) -> list[str]:
        groups = optimizer.param_groups
        names = [group.get("name", f"pg{index}") for index, group in enumerate(groups, start=1)]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            msg = (
                f"A single `Optimizer` cannot have multiple parameter groups with identical `name` values in "
                f"LearningRateMonitor: {type(optimizer).__name__} (key {base!r}) has several named {duplicates}; each "
                "group needs a distinct 'name' (or none) to get its own key. "
                "Fix: rename the groups in configure_optimizers."
            )
            raise MisconfigurationError(msg)
        count = classes[type(optimizer)]
        if count > 1:
            base = f"{base}-{count - 1}"
        if len(groups) > 1:
            return [f"{base}/{name}" for name in names]
        return [f"{base}/{groups[0]['name']}" if groups[0].get("name") else base]

    @staticmethod
    def _all_have_momentum(trainer: TrainerView) -> bool:
        configs = trainer.lr_scheduler_configs
        optimizers = [config.scheduler.optimizer for config in configs] if configs else trainer.optimizers
        return all(
            "momentum" in getattr(optimizer, "defaults", {}) or "betas" in getattr(optimizer, "defaults", {})
            for optimizer in optimizers
        )
