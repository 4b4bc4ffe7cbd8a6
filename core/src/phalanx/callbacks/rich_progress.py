"""RichProgressBar: the progress display drawn with rich (Lightning's ``RichProgressBar``).

Same information as the tqdm bar (stage, batches done and total, elapsed and remaining time, the
progress-bar metrics), drawn by rich, which renders well in notebooks and terminals alike. rich is
an optional dependency: constructing the callback without it raises one error naming
``pip install rich``. Drawn by global rank 0 only.

Pass it explicitly (``Trainer(callbacks=[RichProgressBar()])``); ``enable_progress_bar=True``
alone gives the tqdm bar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phalanx.callbacks._rich import require_rich
from phalanx.callbacks.progress_bar import ProgressBar
from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["RichProgressBar", "RichProgressBarTheme"]


@dataclass
class RichProgressBarTheme:
    """Styles of the display (rich style strings), under Lightning's field names."""

    description: str = ""
    progress_bar: str = "#6206E0"
    progress_bar_finished: str = "#6206E0"
    progress_bar_pulse: str = "#6206E0"
    batch_progress: str = ""
    time: str = "dim"
    processing_speed: str = "dim underline"
    metrics: str = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


def _total(value: float) -> int | float | None:
    """rich's total: None (an indeterminate bar) when unknown or infinite, an int when whole."""
    if value is None or math.isinf(value):
        return None
    return int(value) if float(value).is_integer() else float(value)


class RichProgressBar(ProgressBar):
    """Shows training, validation, test and predict progress with rich.

    The display follows Lightning's: one rich ``Progress`` per stage, kept (stopped) after the
    stage ends so its tasks can be read (``bar.progress.tasks``); a task for the sanity check
    (hidden when it ends), one training task reset every epoch (a new display per epoch with
    ``leave``), and one task per validation / test / predict dataloader run. The progress-bar
    metrics are shown beside the training task.

    Args:
        refresh_rate: Redraw every ``refresh_rate`` batches; 0 disables the display.
        leave: Keep each finished epoch's bar on screen.
        theme: Styles of the display.
        console_kwargs: Passed to ``rich.console.Console`` (e.g. ``{"file": stream}``).

    Raises:
        ModuleNotFoundError: rich is not installed (the message says ``pip install rich``).
        MisconfigurationError: ``refresh_rate`` is not an int >= 0.
    """

    def __init__(
        self,
        refresh_rate: int = 1,
        leave: bool = False,
        theme: RichProgressBarTheme | None = None,
        console_kwargs: dict[str, Any] | None = None,
    ) -> None:
        require_rich(type(self).__name__)
        if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 0:
            msg = f"RichProgressBar(refresh_rate={refresh_rate!r}) is invalid; pass an int >= 1 (0 disables the bar)."
            raise MisconfigurationError(msg)
        super().__init__()
        self._refresh_rate = refresh_rate
        self._leave = leave
        self.theme = theme or RichProgressBarTheme()
        self._console_kwargs = console_kwargs or {}
        self.progress: Any = None
        self._progress_stopped = False
        self._metrics_text = ""
        self._updates = 0
        self._reset_progress_bar_ids()

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the live display (it holds a console and a lock; it cannot be pickled)."""
        return {**self.__dict__, "progress": None}

    @property
    def refresh_rate(self) -> int:
        """Batches between redraws (0: the display is off)."""
        return self._refresh_rate

    @property
    def leave(self) -> bool:
        """Whether each finished epoch's bar stays on screen."""
        return self._leave

    @property
    def is_enabled(self) -> bool:
        """Whether this process draws: enabled, and a refresh rate above 0."""
        return self._enabled and self.refresh_rate > 0

    @property
    def train_progress_bar(self) -> Any:
        """The training task (a ``rich.progress.Task``)."""
        return self._task(self.train_progress_bar_id)

    @property
    def val_sanity_check_bar(self) -> Any:
        """The sanity-check task."""
        return self._task(self.val_sanity_progress_bar_id)

    @property
    def val_progress_bar(self) -> Any:
        """The task of the validation dataloader being run (or last run)."""
        return self._task(self.val_progress_bar_id)

    @property
    def test_progress_bar(self) -> Any:
        """The task of the test dataloader being run (or last run)."""
        return self._task(self.test_progress_bar_id)

    def _task(self, task_id: Any) -> Any:
        if self.progress is None or task_id is None:
            msg = f"{type(self).__name__}: that bar does not exist yet; it is created when its stage starts."
            raise TypeError(msg)
        return self.progress.tasks[task_id]

    def _reset_progress_bar_ids(self) -> None:
        self.train_progress_bar_id: Any = None
        self.val_sanity_progress_bar_id: Any = None
        self.val_progress_bar_id: Any = None
        self.test_progress_bar_id: Any = None
        self.predict_progress_bar_id: Any = None

    # ------------------------------------------------------------------ drawing
    def _init_progress(self, trainer: TrainerView) -> None:
        """Start a display for a stage (a stopped one is replaced; its tasks are not reused)."""
        if not self.is_enabled or (self.progress is not None and not self._progress_stopped):
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._reset_progress_bar_ids()
        self.reset_dataloader_idx_tracker()
        theme = self.theme
        self.progress = Progress(
            TextColumn("[progress.description]{task.description}", style=theme.description),
            BarColumn(complete_style=theme.progress_bar, finished_style=theme.progress_bar_finished,
                      pulse_style=theme.progress_bar_pulse),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[metrics]}", style=theme.metrics),
            console=Console(**self._console_kwargs),
            auto_refresh=False,
        )  # fmt: skip
        self.progress.start()
        self._progress_stopped = False

    def _stop_progress(self) -> None:
        if self.progress is not None and not self._progress_stopped:
            self.progress.refresh()
            self.progress.stop()
            self._progress_stopped = True

    def _add_task(self, total: float, description: str, *, visible: bool = True) -> Any:
        return self.progress.add_task(description, total=_total(total), visible=visible, metrics="")

    def _hide(self, task_id: Any) -> None:
        if self.progress is not None and task_id is not None:
            self.progress.update(task_id, advance=0, visible=False)

    def _update(self, task_id: Any, completed: int) -> None:
        if self.progress is not None and self.is_enabled and task_id is not None:
            self.progress.update(task_id, completed=completed, visible=True)
            self._updates += 1
            if self._updates % self.refresh_rate == 0:
                self.progress.refresh()

    def _metrics_line(self, metrics: dict[str, Any]) -> str:
        theme = self.theme
        parts = []
        for key, value in metrics.items():
            number = float(value) if not isinstance(value, (str, dict)) else None
            shown = format(number, theme.metrics_format) if number is not None and not number.is_integer() else value
            parts.append(f"{key}: {shown}")
        return theme.metrics_text_delimiter.join(parts)

    def _update_metrics(self, trainer: TrainerView, pl_module: Module) -> None:
        if not self.is_enabled or self.progress is None:
            return
        self._metrics_text = self._metrics_line(self.get_metrics(trainer, pl_module))
        if self.train_progress_bar_id is not None and not self._progress_stopped:
            self.progress.update(self.train_progress_bar_id, metrics=self._metrics_text)

    def get_metrics(self, trainer: TrainerView, pl_module: Module) -> dict[str, int | str | float | dict[str, float]]:
        """The metrics shown, as Python numbers."""
        metrics = super().get_metrics(trainer, pl_module)
        return {key: value.item() if hasattr(value, "item") else value for key, value in metrics.items()}

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print above the display."""
        if self.progress is not None and not self._progress_stopped:
            self.progress.console.print(*args, **kwargs)
        else:
            print(*args, **kwargs)

    def _train_description(self, epoch: int) -> str:
        description = f"Epoch {epoch}"
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs > 0:
            description += f"/{max_epochs - 1}"
        return f"{description:{len(self.validation_description)}}"

    # ------------------------------------------------------------------ stage starts and ends
    def on_sanity_check_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the display."""
        self._init_progress(trainer)

    def on_sanity_check_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Hide the sanity-check task."""
        self._hide(self.val_sanity_progress_bar_id)

    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the display."""
        self._init_progress(trainer)

    def on_validation_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the display (validate alone)."""
        self._init_progress(trainer)

    def on_test_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the display."""
        self._init_progress(trainer)

    def on_predict_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the display."""
        self._init_progress(trainer)

    def teardown(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Stop the display (its tasks stay readable)."""
        self._stop_progress()

    def on_exception(self, trainer: TrainerView, pl_module: Module, exception: BaseException) -> None:
        """Stop drawing so the traceback is readable."""
        self._stop_progress()

    # ------------------------------------------------------------------ training
    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Reset the training task for the epoch (a new display per epoch with ``leave``)."""
        if self.is_disabled:
            return
        if self.train_progress_bar_id is not None and self._leave:
            self._stop_progress()
            self._init_progress(trainer)
        if self.progress is None:
            return
        description = self._train_description(trainer.current_epoch)
        if self.train_progress_bar_id is None:
            self.train_progress_bar_id = self._add_task(self.total_train_batches, description)
        else:
            self.progress.reset(
                self.train_progress_bar_id, total=_total(self.total_train_batches), description=description,
                visible=True,
            )  # fmt: skip
        if self._metrics_text:
            self.progress.update(self.train_progress_bar_id, metrics=self._metrics_text)

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Advance and show the latest metrics."""
        self._update(self.train_progress_bar_id, batch_idx + 1)
        self._update_metrics(trainer, pl_module)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Show the epoch's aggregated metrics."""
        self._update_metrics(trainer, pl_module)

    # ------------------------------------------------------------------ evaluation
    def on_validation_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """A task per validation (or sanity-check) dataloader run."""
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        total = self.total_val_batches_current_dataloader
        if trainer.sanity_checking:
            self._hide(self.val_sanity_progress_bar_id)
            self.val_sanity_progress_bar_id = self._add_task(total, self.sanity_check_description, visible=False)
        else:
            self._hide(self.val_progress_bar_id)
            self.val_progress_bar_id = self._add_task(total, self.validation_description, visible=False)

    def on_validation_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Advance the validation (or sanity-check) task."""
        if self.is_disabled:
            return
        task = self.val_sanity_progress_bar_id if trainer.sanity_checking else self.val_progress_bar_id
        self._update(task, batch_idx + 1)

    def on_validation_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Inside fit, hide the finished validation task."""
        if self.is_enabled and trainer.state.fn == "fit":
            self._hide(self.val_progress_bar_id)

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Show the validation metrics beside the training task."""
        if trainer.state.fn == "fit":
            self._update_metrics(trainer, pl_module)
        self.reset_dataloader_idx_tracker()

    def on_test_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """A task per test dataloader."""
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        self._hide(self.test_progress_bar_id)
        self.test_progress_bar_id = self._add_task(self.total_test_batches_current_dataloader, self.test_description)

    def on_test_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Advance the test task."""
        if self.is_enabled:
            self._update(self.test_progress_bar_id, batch_idx + 1)

    def on_test_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Forget the dataloader."""
        self.reset_dataloader_idx_tracker()

    def on_predict_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """A task per predict dataloader."""
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        self._hide(self.predict_progress_bar_id)
        total = self.total_predict_batches_current_dataloader
        self.predict_progress_bar_id = self._add_task(total, self.predict_description)

    def on_predict_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Advance the predict task."""
        if self.is_enabled:
            self._update(self.predict_progress_bar_id, batch_idx + 1)

    def on_predict_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Forget the dataloader."""
        self.reset_dataloader_idx_tracker()
