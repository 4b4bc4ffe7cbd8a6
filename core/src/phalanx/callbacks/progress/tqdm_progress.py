"""TQDMProgressBar: Lightning's default bar, drawn with tqdm by global rank 0 only.

Every rank runs the same loop, so without the rank check a 4-process DDP job would draw four
interleaved bars. The bars and their life cycle are Lightning's (a training bar that stays, and a
sanity-check, validation, test or predict bar per run, reset for each dataloader), and so are the
``init_*_tqdm`` methods a subclass overrides to restyle one bar. Metrics are converted to Python
numbers only when the bar shows them, so drawing adds no per-step device synchronisation beyond
what displaying the numbers needs.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from typing import TYPE_CHECKING, Any

from phalanx.callbacks.progress_bar import ProgressBar
from phalanx.errors import MisconfigurationError

# tqdm.auto draws notebook widgets, which need ipywidgets; without it, the plain terminal bar.
if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm import tqdm

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["TQDMProgressBar", "Tqdm", "convert_inf"]

#: Width a float or string metric is padded to, so the postfix does not jitter as digits change.
_PAD_SIZE = 5


def convert_inf(x: int | float | None) -> int | float | None:
    """``x``, or None for an infinite or NaN total (tqdm then shows no total: an iterable dataset)."""
    if x is None or math.isinf(x) or math.isnan(x):
        return None
    return x


def _bar_total(x: int | float | None) -> int | float | None:
    """A total for tqdm: None when unknown or infinite, an int when whole (``2``, not ``2.0``)."""
    x = convert_inf(x)
    return int(x) if isinstance(x, float) and x.is_integer() else x


def _update_n(bar: Any, value: int) -> None:
    """Move ``bar`` to ``value`` (absolute, so a skipped refresh never loses count)."""
    if not bar.disable:
        bar.n = value
        bar.refresh()


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

    Up to four bars: the sanity check, training (stays on screen; paused while validation runs
    inside fit), validation (temporary inside fit), test and predict. Override ``init_train_tqdm``
    & co. to change one bar's look.

    Args:
        refresh_rate: Redraw every ``refresh_rate`` batches; ``0`` disables the bar. The
            ``TQDM_MINITERS`` environment variable raises it (the larger value wins); on Colab
            (``COLAB_GPU`` set) a rate of 1 becomes 20, as a faster one stalls the notebook.
        process_position: Offset the bars by this many lines (to stack them under other bars).
        leave: Keep each epoch's training bar on screen (a new bar per epoch).

    Raises:
        MisconfigurationError: ``refresh_rate`` is not an int >= 0.
    """

    #: tqdm's layout: the rate without the inverse ("s/it") form, the metrics after it.
    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 0:
            msg = f"TQDMProgressBar(refresh_rate={refresh_rate!r}) is invalid; pass an int >= 1 (0 disables the bar)."
            raise MisconfigurationError(msg)
        super().__init__()
        self._refresh_rate = self._resolve_refresh_rate(refresh_rate)
        self._process_position = process_position
        self._leave = leave
        self._train_progress_bar: Any = None
        self._val_progress_bar: Any = None
        self._test_progress_bar: Any = None
        self._predict_progress_bar: Any = None

    @staticmethod
    def _resolve_refresh_rate(refresh_rate: int) -> int:
        if os.getenv("COLAB_GPU") and refresh_rate == 1:
            return 20
        if "TQDM_MINITERS" in os.environ:
            return max(int(os.environ["TQDM_MINITERS"]), refresh_rate)
        return refresh_rate

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the open bars (a tqdm bar holds a lock and a stream; it cannot be pickled)."""
        return {key: None if isinstance(value, tqdm) else value for key, value in vars(self).items()}

    # ------------------------------------------------------------------ the bars
    def _get(self, name: str) -> Any:
        bar = getattr(self, f"_{name}_progress_bar")
        if bar is None:
            msg = f"{type(self).__name__}.{name}_progress_bar is not set yet: it is created when its stage starts."
            raise TypeError(msg)
        return bar

    @property
    def train_progress_bar(self) -> Any:
        """The training bar (TypeError before training started)."""
        return self._get("train")

    @train_progress_bar.setter
    def train_progress_bar(self, bar: Any) -> None:
        self._train_progress_bar = bar

    @property
    def val_progress_bar(self) -> Any:
        """The sanity-check or validation bar (TypeError before the first one)."""
        return self._get("val")

    @val_progress_bar.setter
    def val_progress_bar(self, bar: Any) -> None:
        self._val_progress_bar = bar

    @property
    def test_progress_bar(self) -> Any:
        """The test bar (TypeError before testing started)."""
        return self._get("test")

    @test_progress_bar.setter
    def test_progress_bar(self, bar: Any) -> None:
        self._test_progress_bar = bar

    @property
    def predict_progress_bar(self) -> Any:
        """The predict bar (TypeError before predicting started)."""
        return self._get("predict")

    @predict_progress_bar.setter
    def predict_progress_bar(self, bar: Any) -> None:
        self._predict_progress_bar = bar

    @property
    def refresh_rate(self) -> int:
        """Batches between redraws (0: the bar is off)."""
        return self._refresh_rate

    @property
    def process_position(self) -> int:
        """Lines the bars are offset by."""
        return self._process_position

    @property
    def leave(self) -> bool:
        """Whether each epoch's training bar stays on screen."""
        return self._leave

    @property
    def is_enabled(self) -> bool:
        """Whether this process draws: enabled, and a refresh rate above 0."""
        return self._enabled and self.refresh_rate > 0

    @property
    def is_disabled(self) -> bool:
        """Whether this process draws nothing."""
        return not self.is_enabled

    def _tqdm(self, desc: str, *, position: int = 0, leave: bool, **kwargs: Any) -> Tqdm:
        return Tqdm(
            desc=desc,
            position=2 * self.process_position + position,
            disable=self.is_disabled,
            leave=leave,
            dynamic_ncols=True,
            file=sys.stdout,
            bar_format=self.BAR_FORMAT,
            **kwargs,
        )

    def init_sanity_tqdm(self) -> Tqdm:
        """The sanity-check bar (override to restyle it)."""
        return self._tqdm(self.sanity_check_description, leave=False)

    def init_train_tqdm(self) -> Tqdm:
        """The training bar (override to restyle it)."""
        return self._tqdm(self.train_description, leave=True, smoothing=0)

    def init_predict_tqdm(self) -> Tqdm:
        """The predict bar (override to restyle it)."""
        return self._tqdm(self.predict_description, leave=True, smoothing=0)

    def init_validation_tqdm(self) -> Tqdm:
        """The validation bar: below the training bar and temporary inside fit; alone and kept in validate."""
        inside_fit = self.trainer.state.fn != "validate"
        return self._tqdm(self.validation_description, position=int(inside_fit), leave=not inside_fit)

    def init_test_tqdm(self) -> Tqdm:
        """The test bar (override to restyle it)."""
        return self._tqdm(self.test_description, leave=True)

    def _should_update(self, current: int, total: Any) -> bool:
        return self.is_enabled and (current % self.refresh_rate == 0 or current == total)

    @staticmethod
    def _reset(bar: Any, total: int | float | None, description: str) -> None:
        bar.reset()
        bar.total = total
        bar.initial = 0
        bar.set_description(description)

    # ------------------------------------------------------------------ sanity check and training
    def on_sanity_check_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open the sanity-check bar (and a placeholder training bar, for print)."""
        self.val_progress_bar = self.init_sanity_tqdm()
        self.train_progress_bar = Tqdm(disable=True)

    def on_sanity_check_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the sanity-check bar."""
        self.val_progress_bar.close()
        self.train_progress_bar.close()

    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open the training bar."""
        self.train_progress_bar = self.init_train_tqdm()

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Reset the training bar for the epoch (a new bar with ``leave``)."""
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        self._reset(self.train_progress_bar, _bar_total(self.total_train_batches), f"Epoch {trainer.current_epoch}")

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Advance the training bar and show the latest metrics."""
        bar = self._train_progress_bar
        n = batch_idx + 1
        if bar is not None and self._should_update(n, bar.total):
            _update_n(bar, n)
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Show the epoch's aggregated metrics."""
        bar = self.train_progress_bar
        if not bar.disable:
            bar.set_postfix(self.get_metrics(trainer, pl_module))
        if self._leave:
            bar.close()

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the training bar."""
        self.train_progress_bar.close()

    # ------------------------------------------------------------------ evaluation
    def on_validation_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open a validation bar (the sanity check has its own)."""
        if not trainer.sanity_checking:
            self.val_progress_bar = self.init_validation_tqdm()

    def on_validation_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Reset the bar when a new dataloader starts."""
        if self.has_dataloader_changed(dataloader_idx):
            desc = self.sanity_check_description if trainer.sanity_checking else self.validation_description
            total = _bar_total(self.total_val_batches_current_dataloader)
            self._reset(self.val_progress_bar, total, f"{desc} DataLoader {dataloader_idx}")

    def on_validation_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Advance the validation bar."""
        bar = self._val_progress_bar
        if bar is not None and self._should_update(batch_idx + 1, bar.total):
            _update_n(bar, batch_idx + 1)

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the validation bar and show validation metrics on the training bar."""
        self.val_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        if self._train_progress_bar is not None and trainer.state.fn == "fit":
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_test_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open the test bar."""
        self.test_progress_bar = self.init_test_tqdm()

    def on_test_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Reset the bar when a new dataloader starts."""
        if self.has_dataloader_changed(dataloader_idx):
            total = _bar_total(self.total_test_batches_current_dataloader)
            self._reset(self.test_progress_bar, total, f"{self.test_description} DataLoader {dataloader_idx}")

    def on_test_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Advance the test bar."""
        bar = self._test_progress_bar
        if bar is not None and self._should_update(batch_idx + 1, bar.total):
            _update_n(bar, batch_idx + 1)

    def on_test_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the test bar."""
        self.test_progress_bar.close()
        self.reset_dataloader_idx_tracker()

    def on_predict_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Open the predict bar."""
        self.predict_progress_bar = self.init_predict_tqdm()

    def on_predict_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Reset the bar when a new dataloader starts."""
        if self.has_dataloader_changed(dataloader_idx):
            total = _bar_total(self.total_predict_batches_current_dataloader)
            self._reset(self.predict_progress_bar, total, f"{self.predict_description} DataLoader {dataloader_idx}")

    def on_predict_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Advance the predict bar."""
        bar = self._predict_progress_bar
        if bar is not None and self._should_update(batch_idx + 1, bar.total):
            _update_n(bar, batch_idx + 1)

    def on_predict_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Close the predict bar."""
        self.predict_progress_bar.close()
        self.reset_dataloader_idx_tracker()

    def on_exception(self, trainer: TrainerView, pl_module: Module, exception: BaseException) -> None:
        """Close any open bar so the traceback is readable."""
        for name in ("val", "test", "predict", "train"):
            bar = getattr(self, f"_{name}_progress_bar")
            if bar is not None:
                bar.close()

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """Print above the active bar (training, else validation, test, predict) without garbling it."""
        for bar in (self._train_progress_bar, self._val_progress_bar, self._test_progress_bar,
                    self._predict_progress_bar):  # fmt: skip
            if bar is not None and not bar.disable:
                bar.write(sep.join(map(str, args)), **kwargs)
                return
