"""EarlyStopping: end fit when a monitored metric stops improving, crosses a threshold or diverges.

Training past the point where the validation metric stops getting better wastes compute and tends
to overfit, so the callback counts the checks without improvement and sets ``trainer.should_stop``
after ``patience`` of them (the Trainer still honours ``min_epochs`` / ``min_steps``).

Every rank must end fit at the same batch: a rank that leaves the loop alone leaves the others
blocked in their next collective. Metrics logged without ``sync_dist`` differ between ranks, so
each rank judges its own value and the ranks then agree through the strategy's
``reduce_boolean_decision``: if any rank wants to stop, all stop. The same agreement covers a
metric missing on only some ranks, so one rank never raises or skips while the others wait.

The callback's counters go into checkpoints (keyed by monitor and mode), so a resumed run keeps
counting where it left off instead of granting a fresh ``patience``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.utilities.rank_zero import rank_prefixed_message, rank_zero_warn

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["EarlyStopping", "EarlyStoppingReason"]

log = logging.getLogger(__name__)

_MODES = ("min", "max")


class EarlyStoppingReason(Enum):
    """Why :class:`EarlyStopping` stopped training (values as Lightning's, so checkpoints agree)."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class _MonitorMissingError(MisconfigurationError, RuntimeError):
    """The monitored metric was never logged.

    A configuration mistake (so a :class:`MisconfigurationError`), and also a ``RuntimeError``
    because that is what Lightning raises here: a ported ``except RuntimeError`` keeps working.
    """


class EarlyStopping(Callback):
    """Stop fit when ``monitor`` has not improved for ``patience`` checks.

    A check runs after each validation, or at the end of each training epoch when validation runs
    exactly once per epoch or not at all (``check_on_train_epoch_end`` overrides this). Checks are
    skipped outside fit, during the sanity check and in a ``fast_dev_run``. ``patience`` counts
    checks, not epochs: with ``check_val_every_n_epoch=10`` and ``patience=3`` fit runs at least 40
    epochs.

    Args:
        monitor: Name of the metric in ``trainer.callback_metrics`` (what ``self.log`` recorded).
        min_delta: Smallest change that counts as an improvement; a change of ``min_delta`` or
            less does not reset the count.
        patience: Checks without improvement after which fit stops.
        verbose: Log every improvement and the reason for stopping (INFO on the ``phalanx`` logger).
        mode: ``"min"`` (lower is better, e.g. a loss) or ``"max"`` (higher is better, e.g. accuracy).
        strict: Raise when ``monitor`` is not among the logged metrics; with ``False`` such a check
            is skipped (with a warning when ``verbose``).
        check_finite: Stop as soon as the metric is NaN or infinite.
        stopping_threshold: Stop as soon as the metric is better than this value (the goal is met).
        divergence_threshold: Stop as soon as the metric is worse than this value (no hope left).
        check_on_train_epoch_end: Check at the end of the training epoch (True) or after
            validation (False); None decides as described above.
        log_rank_zero_only: With several processes, only rank 0 logs its messages; otherwise each
            rank logs its own, prefixed with its rank.

    Attributes:
        wait_count: Checks since the last improvement.
        best_score: Best value seen (a 0-d tensor; ``inf`` / ``-inf`` before the first check).
        stopped_epoch: The epoch in which the callback asked fit to stop (0 if it never did).
        stopping_reason: An :class:`EarlyStoppingReason`; the same on every rank.
        stopping_reason_message: Why fit was stopped, in words (None until it is).

    Raises:
        MisconfigurationError: ``mode`` is not ``"min"`` or ``"max"``, ``monitor`` is not a
            string, or (``strict=True``) the metric is missing when a check runs.
    """

    mode_dict: ClassVar[dict[str, Callable[..., torch.Tensor]]] = {"min": torch.lt, "max": torch.gt}
    order_dict: ClassVar[dict[str, str]] = {"min": "<", "max": ">"}
    #: Runs after the Module's ``on_train_epoch_end`` and the epoch's aggregation, so it sees final values.
    monitors_metrics = True

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            msg = f"EarlyStopping(monitor={monitor!r}) must name a logged metric; pass e.g. monitor='val_loss'."
            raise MisconfigurationError(msg)
        if mode not in _MODES:
            msg = (
                f"EarlyStopping(mode={mode!r}) is invalid: `mode` can be {', '.join(map(repr, _MODES))}, got {mode}. "
                "Fix: pass "
                "mode='min' when lower is better (a loss) or mode='max' when higher is better (an accuracy)."
            )
            raise MisconfigurationError(msg)
        self.monitor = monitor
        self.mode = mode
        # Stored with the sign that makes "current - min_delta beats best" the improvement test in
        # both modes (Lightning keeps the same signed value in this attribute).
        self.min_delta = float(min_delta) if mode == "max" else -float(min_delta)
        self.patience = patience
        self.verbose = verbose
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self._check_on_train_epoch_end = check_on_train_epoch_end
        self.log_rank_zero_only = log_rank_zero_only
        self.wait_count = 0
        self.stopped_epoch = 0
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self.best_score = torch.tensor(math.inf if mode == "min" else -math.inf)

    @property
    def monitor_op(self) -> Callable[..., torch.Tensor]:
        """``torch.lt`` in min mode, ``torch.gt`` in max mode: ``op(a, b)`` means a is better than b."""
        return self.mode_dict[self.mode]

    @property
    def state_key(self) -> str:
        """Unique per monitor and mode, so several EarlyStopping callbacks restore their own counts."""
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The counters, so a resumed fit continues counting (plain types and a tensor: weights_only-safe)."""
        return {
            "wait_count": self.wait_count,
            "stopped_epoch": self.stopped_epoch,
            "best_score": self.best_score.detach().clone(),
            "patience": self.patience,
            "stopping_reason": self.stopping_reason.value,
            "stopping_reason_message": self.stopping_reason_message,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counters; ``patience`` comes from the checkpoint, as in Lightning."""
        self.wait_count = int(state_dict["wait_count"])
        self.stopped_epoch = int(state_dict["stopped_epoch"])
        self.best_score = torch.as_tensor(state_dict["best_score"]).detach().cpu()
        self.patience = state_dict["patience"]
        self.stopping_reason = EarlyStoppingReason(state_dict.get("stopping_reason", 0))
        self.stopping_reason_message = state_dict.get("stopping_reason_message")

    # ------------------------------------------------------------------ hooks
    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Check here when validation runs once per epoch or not at all (or when asked to)."""
        if self._checks_on_train_epoch_end(trainer) and not self._should_skip_check(trainer):
            self._run_early_stopping_check(trainer)

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Check after each validation when validation runs more or less often than once per epoch."""
        if not self._checks_on_train_epoch_end(trainer) and not self._should_skip_check(trainer):
            self._run_early_stopping_check(trainer)

    # ------------------------------------------------------------------ decisions
    def _checks_on_train_epoch_end(self, trainer: TrainerView) -> bool:
        if self._check_on_train_epoch_end is not None:
            return self._check_on_train_epoch_end
        if not trainer.validation_enabled:
            return True  # no validation end will ever come; the epoch end is the only check point
        # An int interval counts batches (val_check_interval=1 validates after every batch), so only
        # the float 1.0 means "once, at the end of each epoch" (Lightning's == 1.0 also matched the int 1).
        interval = trainer.val_check_interval
        return isinstance(interval, float) and interval == 1.0 and trainer.check_val_every_n_epoch == 1

    def _should_skip_check(self, trainer: TrainerView) -> bool:
        return trainer.state.fn != "fit" or trainer.sanity_checking or bool(trainer.fast_dev_run)

    def _run_early_stopping_check(self, trainer: TrainerView) -> None:
        """Judge this rank's value, then stop every rank if any rank's judgement says stop."""
        value = trainer.callback_metrics.get(self.monitor)
        if not self._monitor_available(trainer, value):
            return
        current = self._as_scalar(value)
        local_stop, reason = self._evaluate_stopping_criteria(current)
        should_stop = bool(trainer.strategy.reduce_boolean_decision(local_stop, all=False))
        trainer.should_stop = trainer.should_stop or should_stop
        if reason and self.verbose:
            self._log_info(trainer, reason, self.log_rank_zero_only)
        if not should_stop:
            return
        self.stopped_epoch = trainer.current_epoch
        if trainer.world_size > 1:
            self._agree_on_reason(trainer, local_stop, reason)
            if self.verbose and not local_stop and self.stopping_reason_message:
                self._log_info(
                    trainer, f"Stopping with the other ranks: {self.stopping_reason_message}", self.log_rank_zero_only
                )
        else:
            self.stopping_reason_message = reason

    def _monitor_available(self, trainer: TrainerView, value: Any) -> bool:
        """Whether every rank has the metric; raise on every rank (``strict``) or skip on every rank."""
        missing = value is None
        if trainer.world_size > 1:
            missing = bool(trainer.strategy.reduce_boolean_decision(missing, all=False))
        if not missing:
            return True
        available = sorted(trainer.callback_metrics)
        where = "" if value is None else " on at least one other rank"
        msg = (
            f"EarlyStopping(monitor={self.monitor!r}) found no metric {self.monitor!r}{where}; logged metrics "
            f"are {available}. Fix: log it with self.log({self.monitor!r}, value) (in validation_step when "
            "checking after validation), correct the monitor name, or pass strict=False to skip checks while "
            "it is missing."
        )
        if self.strict:
            raise _MonitorMissingError(msg)
        if self.verbose:
            rank_zero_warn(msg, category=RuntimeWarning)
        return False

    def _as_scalar(self, value: Any) -> torch.Tensor:
        current = torch.as_tensor(value).detach().cpu().squeeze()
        if current.numel() != 1:
            msg = (
                f"EarlyStopping(monitor={self.monitor!r}) needs one number, but the logged value has shape "
                f"{tuple(current.shape)}. Log a scalar (e.g. the mean) under {self.monitor!r}."
            )
            raise MisconfigurationError(msg)
        return current if current.is_floating_point() else current.float()

    def _evaluate_stopping_criteria(self, current: torch.Tensor) -> tuple[bool, str | None]:
        """This rank's verdict on ``current``: (stop?, message); updates best score and wait count.

        Order matters: a non-finite value stops before anything compares with it, and the two
        thresholds act immediately, before patience is consulted.
        """
        order = self.order_dict[self.mode]
        shown = _fmt(current)
        if self.check_finite and not bool(torch.isfinite(current)):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (
                f"Monitored metric {self.monitor} = {shown} is not finite; the best value so far was "
                f"{_fmt(self.best_score)}. Signaling Trainer to stop."
            )
        if self.stopping_threshold is not None and bool(self.monitor_op(current, self.stopping_threshold)):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (
                f"Stopping threshold reached: {self.monitor} = {shown} {order} {self.stopping_threshold}. "
                "Signaling Trainer to stop."
            )
        if self.divergence_threshold is not None and bool(self.monitor_op(-current, -self.divergence_threshold)):
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (
                f"Divergence threshold reached: {self.monitor} = {shown} is worse than "
                f"{self.divergence_threshold} (better means {order}). Signaling Trainer to stop."
            )
        if bool(self.monitor_op(current - self.min_delta, self.best_score.to(current.dtype))):
            message = self._improvement_message(current)
            self.best_score = current
            self.wait_count = 0
            return False, message
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return True, (
                f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} checks; "
                f"best score: {_fmt(self.best_score)}. Signaling Trainer to stop."
            )
        return False, None

    def _improvement_message(self, current: torch.Tensor) -> str:
        if bool(torch.isfinite(self.best_score)):
            gain = abs(float(self.best_score) - float(current))
            return (
                f"Metric {self.monitor} improved by {gain:.3f} >= min_delta = {abs(self.min_delta)}. "
                f"New best score: {_fmt(current)}"
            )
        return f"Metric {self.monitor} improved. New best score: {_fmt(current)}"

    def _agree_on_reason(self, trainer: TrainerView, local_stop: bool, reason: str | None) -> None:
        """Give every rank the reason of the lowest rank that asked to stop.

        Runs only once the ranks agreed to stop, so every rank makes these two collectives. Without
        it a rank whose own metric still improved would report NOT_STOPPED for a stopped fit.
        """
        strategy = trainer.strategy
        world = trainer.world_size
        mine = torch.tensor(trainer.global_rank if local_stop else world, device=strategy.root_device)
        first = int(strategy.reduce(mine, reduce_op="min"))
        if first >= world:  # every rank said no locally; some strategy decided otherwise
            self.stopping_reason_message = reason
            return
        ours = (self.stopping_reason, rank_prefixed_message(reason or "", first))
        self.stopping_reason, self.stopping_reason_message = strategy.broadcast(ours, src=first)

    @staticmethod
    def _log_info(trainer: TrainerView, message: str, log_rank_zero_only: bool) -> None:
        rank = trainer.global_rank if trainer.world_size > 1 else None
        if rank is None or not log_rank_zero_only or rank == 0:
            log.info(rank_prefixed_message(message, rank))


def _fmt(value: torch.Tensor) -> str:
    return f"{float(value):.3f}"
