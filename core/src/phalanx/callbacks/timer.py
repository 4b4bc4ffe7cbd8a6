"""Timer: how long each stage ran, and a time budget that stops training when spent.

A job scheduler kills a run at its wall-clock limit whatever it is doing; stopping a little earlier,
at a batch boundary, lets the Trainer finish the epoch's bookkeeping and write its last checkpoint.
``Trainer(max_time=...)`` adds this callback; it can also be added by hand for its per-stage
timings. The elapsed training time is saved in checkpoints, so a resumed run spends what is left
of the budget rather than starting a new one.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.trainer_view import RunningStage
from phalanx.utilities.enums import LightningEnum

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["Interval", "Timer", "parse_duration"]

_FORMS = (
    'a string in the format DD:HH:MM:SS (e.g. "00:12:00:00" for 12 hours), a datetime.timedelta, '
    'or a dict of timedelta arguments (e.g. {"hours": 12})'
)


class Interval(LightningEnum):
    """When the budget is checked: after every training step, or at the end of each epoch."""

    step = "step"
    epoch = "epoch"


_INTERVALS = tuple(member.value for member in Interval)


def parse_duration(
    value: str | timedelta | dict[str, float] | None, *, argument: str = "Timer(duration=...)"
) -> timedelta | None:
    """Read a duration given as ``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of ``timedelta`` arguments.

    Args:
        value: The duration; ``None`` means no limit and is returned as is.
        argument: How the value was passed (``"Trainer(max_time=...)"``), for the error message.

    Raises:
        MisconfigurationError: Any other type, a malformed string, unknown dict keys or a
            negative duration; the message shows the value and the accepted forms.
    """
    if value is None or isinstance(value, timedelta):
        duration = value
    elif isinstance(value, str):
        match = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", value.strip())
        duration = (
            timedelta(days=int(match[1]), hours=int(match[2]), minutes=int(match[3]), seconds=int(match[4]))
            if match
            else None
        )
        if duration is None:
            msg = f"{argument} got {value!r}, which is not a duration: pass {_FORMS}"
            raise MisconfigurationError(msg)
    elif isinstance(value, dict):
        try:
            duration = timedelta(**value)
        except (TypeError, ValueError, OverflowError) as error:
            msg = f"{argument} got {value!r}, which is not a duration ({error}): pass {_FORMS}"
            raise MisconfigurationError(msg) from error
    else:
        msg = f"{argument} got {value!r} of type {type(value).__name__}, which is not a duration: pass {_FORMS}"
        raise MisconfigurationError(msg)
    if duration is not None and duration < timedelta(0):
        msg = f"{argument} got {value!r}, a negative duration: pass a duration of zero or more, as {_FORMS}"
        raise MisconfigurationError(msg)
    return duration


class Timer(Callback):
    """Time the train/validate/test/predict loops and stop training when ``duration`` has passed.

    Ranks take rank 0's decision (``trainer.strategy.broadcast``), so they stop at the same batch
    even when their clocks disagree slightly.

    Args:
        duration: The training time budget: ``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of
            ``timedelta`` arguments; ``None`` only measures.
        interval: Check after every training batch (``"step"``) or only at epoch ends (``"epoch"``).
        verbose: Say when the limit is reached (on rank 0).

    Raises:
        MisconfigurationError: ``duration`` or ``interval`` is not one of the accepted forms.

    Example::

        trainer = Trainer(callbacks=[Timer(duration="00:12:00:00")])  # stop after 12 hours
        timer.time_elapsed("train"), timer.start_time("validate"), timer.end_time("test")
    """

    def __init__(
        self,
        duration: str | timedelta | dict[str, float] | None = None,
        interval: str = "step",
        verbose: bool = True,
    ) -> None:
        budget = parse_duration(duration)
        if interval not in _INTERVALS:
            msg = f"Unsupported parameter value Timer(interval={interval!r}): pass one of {list(_INTERVALS)}"
            raise MisconfigurationError(msg)
        self._duration = budget.total_seconds() if budget is not None else None
        self._interval = "step" if interval == "step" else "epoch"  # plain str, also for str-enum values
        self._verbose = verbose
        self._start_time: dict[RunningStage, float | None] = dict.fromkeys(RunningStage)
        self._end_time: dict[RunningStage, float | None] = dict.fromkeys(RunningStage)
        self._offset = 0.0

    # ------------------------------------------------------------------ queries
    def start_time(self, stage: str = RunningStage.TRAINING) -> float | None:
        """When ``stage`` last started (``time.monotonic()`` seconds), or None if it has not run."""
        return self._start_time[RunningStage(stage)]

    def end_time(self, stage: str = RunningStage.TRAINING) -> float | None:
        """When ``stage`` last ended (``time.monotonic()`` seconds), or None if it has not ended."""
        return self._end_time[RunningStage(stage)]

    def time_elapsed(self, stage: str = RunningStage.TRAINING) -> float:
        """Seconds ``stage`` has run, up to now while it runs; for training, including resumed time."""
        start, end = self.start_time(stage), self.end_time(stage)
        offset = self._offset if RunningStage(stage) == RunningStage.TRAINING else 0.0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = RunningStage.TRAINING) -> float | None:
        """Seconds of ``duration`` left for ``stage`` (negative once overrun); None without a duration."""
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    # ------------------------------------------------------------------ timing hooks
    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the training clock (and forget a previous fit's end)."""
        self._start_time[RunningStage.TRAINING] = time.monotonic()
        self._end_time[RunningStage.TRAINING] = None

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Stop the training clock."""
        self._end_time[RunningStage.TRAINING] = time.monotonic()

    def on_validation_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the validation clock."""
        self._start_time[RunningStage.VALIDATING] = time.monotonic()
        self._end_time[RunningStage.VALIDATING] = None

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Stop the validation clock."""
        self._end_time[RunningStage.VALIDATING] = time.monotonic()

    def on_test_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the test clock."""
        self._start_time[RunningStage.TESTING] = time.monotonic()
        self._end_time[RunningStage.TESTING] = None

    def on_test_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Stop the test clock."""
        self._end_time[RunningStage.TESTING] = time.monotonic()

    def on_predict_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the predict clock."""
        self._start_time[RunningStage.PREDICTING] = time.monotonic()
        self._end_time[RunningStage.PREDICTING] = None

    def on_predict_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Stop the predict clock."""
        self._end_time[RunningStage.PREDICTING] = time.monotonic()

    # ------------------------------------------------------------------ the budget
    def on_fit_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Check once before training: a resumed run may have no time left."""
        if self._duration is not None:
            self._check_time_remaining(trainer)

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """With ``interval="step"``, stop once the budget is spent."""
        if self._interval == "step" and self._duration is not None:
            self._check_time_remaining(trainer)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """With ``interval="epoch"``, stop once the budget is spent."""
        if self._interval == "epoch" and self._duration is not None:
            self._check_time_remaining(trainer)

    def state_dict(self) -> dict[str, Any]:
        """Seconds elapsed per stage (``{"time_elapsed": {"train": ..., ...}}``), as Lightning stores them."""
        return {"time_elapsed": {stage.value: self.time_elapsed(stage) for stage in RunningStage}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the training budget from the saved elapsed time."""
        self._offset = float(state_dict.get("time_elapsed", {}).get(RunningStage.TRAINING.value, 0.0))

    def _check_time_remaining(self, trainer: TrainerView) -> None:
        assert self._duration is not None
        stop = bool(trainer.strategy.broadcast(self.time_elapsed() >= self._duration, src=0))
        trainer.should_stop = trainer.should_stop or stop
        if stop and self._verbose:
            elapsed = timedelta(seconds=int(self.time_elapsed(RunningStage.TRAINING)))
            trainer.print(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.")
