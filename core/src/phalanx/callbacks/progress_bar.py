"""ProgressBar: the base class of progress-bar callbacks (Lightning's ``ProgressBar``).

Every bar does the same few things whatever draws it: draw on global rank 0 only, be switched on
and off, print without garbling the display, and show the same metrics (the progress-bar metrics
and the logger's version as ``v_num``). Those live here; :class:`~phalanx.callbacks.progress.TQDMProgressBar`
and :class:`~phalanx.callbacks.rich_progress.RichProgressBar` only draw.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from phalanx.callbacks.callback import Callback

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["ProgressBar", "get_standard_metrics"]


class ProgressBar(Callback):
    """Base class of progress bars: enabling, rank-0 drawing, printing and the metrics shown."""

    def __init__(self) -> None:
        self._enabled = True
        self._trainer: TrainerView | None = None
        self._current_eval_dataloader_idx: int | None = None

    @property
    def trainer(self) -> TrainerView:
        """The Trainer this bar was set up with (set in :meth:`setup`)."""
        if self._trainer is None:
            msg = f"{type(self).__name__}.trainer is not set yet: the Trainer sets it in setup(), when a stage starts."
            raise TypeError(msg)
        return self._trainer

    # ------------------------------------------------------------------ descriptions (override to rename)
    @property
    def sanity_check_description(self) -> str:
        """Label of the sanity-check bar."""
        return "Sanity Checking"

    @property
    def train_description(self) -> str:
        """Label of the training bar."""
        return "Training"

    @property
    def validation_description(self) -> str:
        """Label of the validation bar."""
        return "Validation"

    @property
    def test_description(self) -> str:
        """Label of the test bar."""
        return "Testing"

    @property
    def predict_description(self) -> str:
        """Label of the predict bar."""
        return "Predicting"

    # ------------------------------------------------------------------ totals
    @property
    def total_train_batches(self) -> int | float:
        """Training batches this epoch (``inf`` for data without a length).

        With ``max_epochs=-1`` and a ``max_steps``, the steps left cap it, so the last bar ends
        where training does.
        """
        trainer = self.trainer
        if trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0:
            return min(trainer.num_training_batches, trainer.max_steps - trainer.global_step)
        return trainer.num_training_batches

    def _current(self, batches: Any) -> int | float:
        if isinstance(batches, (list, tuple)):
            idx = self._current_eval_dataloader_idx or 0
            return batches[idx] if idx < len(batches) else 0
        return batches

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        """Batches of the validation (or sanity-check) dataloader being run."""
        trainer = self.trainer
        return self._current(trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches)

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        """Batches of the test dataloader being run."""
        return self._current(self.trainer.num_test_batches)

    @property
    def total_predict_batches_current_dataloader(self) -> int | float:
        """Batches of the predict dataloader being run."""
        return self._current(self.trainer.num_predict_batches)

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches over all validation dataloaders, 0 in an epoch that does not validate."""
        trainer = self.trainer
        every = trainer.check_val_every_n_epoch
        if not trainer.validation_enabled or (every is not None and (trainer.current_epoch + 1) % every != 0):
            return 0
        batches = trainer.num_val_batches
        return sum(batches) if isinstance(batches, (list, tuple)) else batches

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Record ``dataloader_idx`` as the current one; whether it differs from the previous one."""
        previous = self._current_eval_dataloader_idx
        self._current_eval_dataloader_idx = dataloader_idx
        return previous != dataloader_idx

    def reset_dataloader_idx_tracker(self) -> None:
        """Forget the current dataloader (an evaluation run ended)."""
        self._current_eval_dataloader_idx = None

    @property
    def is_enabled(self) -> bool:
        """Whether this process draws the bar."""
        return self._enabled

    @property
    def is_disabled(self) -> bool:
        """Whether this process draws nothing."""
        return not self.is_enabled

    def disable(self) -> None:
        """Stop drawing (other ranks call this through :meth:`setup`)."""
        self._enabled = False

    def enable(self) -> None:
        """Draw again (e.g. after a nested run of a Trainer disabled the bar)."""
        self._enabled = True

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print without breaking the bar; plain ``print`` by default."""
        print(*args, **kwargs)

    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Remember the Trainer; only global rank 0 draws."""
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def get_metrics(self, trainer: TrainerView, pl_module: Module) -> dict[str, int | str | float | dict[str, float]]:
        """The values shown next to the bar: ``v_num`` (the first logger's version) and the progress-bar metrics."""
        standard = get_standard_metrics(trainer)
        shown = trainer.progress_bar_metrics
        clash = sorted(standard.keys() & shown.keys())
        if clash:
            warnings.warn(
                f"The progress bar shows {', '.join(clash)!r} itself, and self.log({clash[0]!r}, ..., prog_bar=True) "
                "replaces it; log under another name, or override get_metrics() to choose.",
                UserWarning,
                stacklevel=2,
            )
        return {**standard, **shown}


def get_standard_metrics(trainer: TrainerView) -> dict[str, int | str]:
    """What every bar shows besides the logged metrics: ``v_num``, the loggers' version.

    One logger gives its version; several give their distinct versions joined with ``_``. A string
    version is cut to its last four characters so it fits beside the bar; no logger, no entry.
    """
    versions = [logger.version for logger in trainer.loggers]
    if not versions:
        return {}
    version = versions[0] if len(versions) == 1 else "_".join(dict.fromkeys(str(v) for v in versions))
    if version in ("", None):
        return {}
    return {"v_num": version[-4:] if isinstance(version, str) else version}
