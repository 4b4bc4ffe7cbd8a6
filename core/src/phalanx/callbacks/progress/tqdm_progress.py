"""A tqdm progress bar for the Trainer, drawn by global rank 0 only.

Every rank runs the same loop, so without the rank check a 4-process DDP job would draw four
interleaved bars. Updates are cheap (tqdm throttles redraws), and metrics are converted to Python
numbers only when the bar shows them, so the bar adds no per-step device synchronisation beyond
what displaying the numbers requires.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from phalanx.callbacks.progress_bar import ProgressBar
from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["TQDMProgressBar", "Tqdm", "convert_inf"]

#: Width a float or string metric is padded to, so the postfix does not jitter as digits change.
_PAD_SIZE = 5


def _total(value: float) -> int | None:
    return None if value is None or math.isinf(value) else int(value)


def convert_inf(x: int | float | None) -> int | float | None:
    """``x``, or None for an infinite or NaN total (tqdm then shows no total: an iterable dataset)."""
    if x is None or math.isinf(x) or math.isnan(x):
        return None
    return x


class Tqdm(tqdm):  # type: ignore[misc]
    """A ``tqdm`` whose float and string numbers are right-padded with zeros to a fixed width.

    Lightning's bar class: a loss shown as ``0.5`` then ``0.4831`` would shift the rest of the line;
    padded (``0.500``, ``0.4831``) it stays put.
    """

    @staticmethod
    def format_num(n: int | float | str) -> str:
        """``n`` as tqdm formats it, padded to the fixed width when it is a float or a numeric string."""
        padded = isinstance(n, (float, str))
        text = n if isinstance(n, str) else str(tqdm.format_num(n))
        if padded and "e" not in text:
            if "." not in text and len(text) < _PAD_SIZE:
                try:
                    float(text)
                except ValueError:
                    return text
                text += "."
            text += "0" * (_PAD_SIZE - len(text))
        return text


class TQDMProgressBar(ProgressBar):
    """Shows training, validation, test and predict progress with the progress-bar metrics.

    Args:
        refresh_rate: Update the bar every ``refresh_rate`` batches; ``0`` disables the bar.
        leave: Keep the training bar on screen after fit ends.

    Raises:
        MisconfigurationError: ``refresh_rate`` is not an int >= 0.
    """

    def __init__(self, refresh_rate: int = 1, *, leave: bool = True) -> None:
        if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 0:
            msg = f"TQDMProgressBar(refresh_rate={refresh_rate!r}) is invalid; pass an int >= 1 (0 disables the bar)."
            raise MisconfigurationError(msg)
        super().__init__()
        self.refresh_rate = refresh_rate
        self.leave = leave
        self._enabled = refresh_rate > 0
        self._train_bar: Any = None
        self._eval_bar: Any = None

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """Print above the bars without garbling them."""
        tqdm.write(sep.join(map(str, args)), file=kwargs.get("file", sys.stdout))

    def _bar(self, desc: str, total: float, *, leave: bool) -> Any:
        return tqdm(desc=desc, total=_total(total), leave=leave, dynamic_ncols=True, file=sys.stderr, smoothing=0)

    def _update(self, bar: Any, batch_idx: int, trainer: TrainerView, total: float) -> None:
        done = batch_idx + 1
        if done % self.refresh_rate == 0 or done == total:
            bar.update(done - bar.n)
            bar.set_postfix(self.get_metrics(trainer, trainer.lightning_module), refresh=False)

    # ------------------------------------------------------------------ training
    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Create the training bar."""
        if self._enabled:
            self._train_bar = self._bar("Training", trainer.num_training_batches, leave=self.leave)

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Reset the bar for the new epoch."""
        if self._train_bar is not None:
            self._train_bar.reset(total=_total(trainer.num_training_batches))
            self._train_bar.set_description(f"Epoch {trainer.current_epoch}")

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Advance the bar and show the latest metrics."""
        if self._train_bar is not None:
            self._update(self._train_bar, batch_idx, trainer, trainer.num_training_batches)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Show the epoch's aggregated metrics."""
        if self._train_bar is not None:
            self._train_bar.set_postfix(self.get_metrics(trainer, trainer.lightning_module))

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the training bar."""
        if self._train_bar is not None:
            self._train_bar.close()
            self._train_bar = None

    # ------------------------------------------------------------------ evaluation
    def _start_eval(self, trainer: TrainerView, desc: str, totals: list[float]) -> None:
        if self._enabled:
            total = sum(totals) if totals else 0
            leave = self._train_bar is None and not trainer.sanity_checking  # temporary inside fit
            self._eval_bar = self._bar(desc, total, leave=leave)

    def _advance_eval(self) -> None:
        if self._eval_bar is not None:
            self._eval_bar.update(1)

    def _end_eval(self, trainer: TrainerView) -> None:
        if self._eval_bar is not None:
            self._eval_bar.set_postfix(self.get_metrics(trainer, trainer.lightning_module), refresh=False)
            self._eval_bar.close()
            self._eval_bar = None
        if self._train_bar is not None:
            self._train_bar.set_postfix(self.get_metrics(trainer, trainer.lightning_module))

    def on_validation_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open a validation bar (temporary during fit)."""
        if trainer.sanity_checking:
            self._start_eval(trainer, "Sanity Checking", trainer.num_sanity_val_batches)
        else:
            self._start_eval(trainer, "Validation", trainer.num_val_batches)

    def on_validation_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Advance the validation bar."""
        self._advance_eval()

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the validation bar and show validation metrics on the training bar."""
        self._end_eval(trainer)

    def on_test_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open the test bar."""
        self._start_eval(trainer, "Testing", trainer.num_test_batches)

    def on_test_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Advance the test bar."""
        self._advance_eval()

    def on_test_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the test bar."""
        self._end_eval(trainer)

    def on_predict_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open the predict bar."""
        self._start_eval(trainer, "Predicting", trainer.num_predict_batches)

    def on_predict_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Advance the predict bar."""
        self._advance_eval()

    def on_predict_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the predict bar."""
        self._end_eval(trainer)

    def on_exception(self, trainer: TrainerView, pl_module: Module, exception: BaseException) -> None:
        """Close any open bar so the traceback is readable."""
        for bar in (self._eval_bar, self._train_bar):
            if bar is not None:
                bar.close()
        self._eval_bar = self._train_bar = None
