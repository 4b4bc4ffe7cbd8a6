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


def _total(value: float) -> float | None:
    return None if value is None or math.isinf(value) else float(value)


class RichProgressBar(ProgressBar):
    """Shows training, validation, test and predict progress with rich.

    Args:
        refresh_rate: Update every ``refresh_rate`` batches; 0 disables the display.
        leave: Keep the finished training bar on screen.
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
        self.refresh_rate = refresh_rate
        self.leave = leave
        self.theme = theme or RichProgressBarTheme()
        self._console_kwargs = console_kwargs or {}
        self._enabled = refresh_rate > 0
        self.progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._eval_done = 0

    # ------------------------------------------------------------------ drawing
    def _progress(self) -> Any:
        if self.progress is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

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
                transient=not self.leave,
                auto_refresh=False,
            )  # fmt: skip
            self.progress.start()
        return self.progress

    def _metrics_text(self, trainer: TrainerView, pl_module: Module) -> str:
        theme = self.theme
        parts = []
        for key, value in self.get_metrics(trainer, pl_module).items():
            number = float(value) if not isinstance(value, (str, dict)) else None
            shown = (
                format(number, theme.metrics_format) if number is not None and not float(number).is_integer() else value
            )
            parts.append(f"{key}: {shown}")
        return theme.metrics_text_delimiter.join(parts)

    def _open(self, name: str, description: str, total: float) -> None:
        if self._enabled:
            progress = self._progress()
            self._tasks[name] = progress.add_task(description, total=_total(total), metrics="")

    def _advance(self, name: str, done: int, trainer: TrainerView, pl_module: Module, total: float) -> None:
        task = self._tasks.get(name)
        if task is None or not (done % self.refresh_rate == 0 or done == total):
            return
        self.progress.update(task, completed=done, metrics=self._metrics_text(trainer, pl_module))
        self.progress.refresh()

    def _close(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            self.progress.refresh()
            if not self.leave or name != "train":
                self.progress.remove_task(task)
        if not self._tasks and self.progress is not None:
            self.progress.stop()
            self.progress = None

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print above the display."""
        if self.progress is not None:
            self.progress.console.print(*args, **kwargs)
        else:
            print(*args, **kwargs)

    # ------------------------------------------------------------------ training
    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """A fresh bar per epoch."""
        self._close("train")
        self._open("train", f"Epoch {trainer.current_epoch}", trainer.num_training_batches)

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Advance and show the latest metrics."""
        self._advance("train", batch_idx + 1, trainer, pl_module, trainer.num_training_batches)

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the training bar."""
        self._close("train")

    # ------------------------------------------------------------------ evaluation
    def on_validation_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open a validation (or sanity check) bar."""
        totals = trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches
        self._open("eval", "Sanity Checking" if trainer.sanity_checking else "Validation", sum(totals))
        self._eval_done = 0

    def on_test_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open the test bar."""
        self._open("eval", "Testing", sum(trainer.num_test_batches))
        self._eval_done = 0

    def on_predict_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open the predict bar."""
        self._open("eval", "Predicting", sum(trainer.num_predict_batches))
        self._eval_done = 0

    def _eval_step(self, trainer: TrainerView, pl_module: Module) -> None:
        self._eval_done += 1
        self._advance("eval", self._eval_done, trainer, pl_module, math.inf)

    def on_validation_batch_end(self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:  # fmt: skip
        """Advance the validation bar."""
        self._eval_step(trainer, pl_module)

    def on_test_batch_end(self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:  # fmt: skip
        """Advance the test bar."""
        self._eval_step(trainer, pl_module)

    def on_predict_batch_end(self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:  # fmt: skip
        """Advance the predict bar."""
        self._eval_step(trainer, pl_module)

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the validation bar."""
        self._close("eval")

    def on_test_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the test bar."""
        self._close("eval")

    def on_predict_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the predict bar."""
        self._close("eval")

    def on_exception(self, trainer: TrainerView, pl_module: Module, exception: BaseException) -> None:
        """Stop drawing so the traceback is readable."""
        for name in list(self._tasks):
            self._close(name)
