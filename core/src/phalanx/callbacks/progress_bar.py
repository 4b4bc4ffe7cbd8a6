"""ProgressBar: the base class of progress-bar callbacks (Lightning's ``ProgressBar``).

Every bar does the same few things whatever draws it: draw on global rank 0 only, be switched on
and off, print without garbling the display, and show the same metrics (the progress-bar metrics
and the logger's version as ``v_num``). Those live here; :class:`~phalanx.callbacks.progress.TQDMProgressBar`
and :class:`~phalanx.callbacks.rich_progress.RichProgressBar` only draw.
"""

from __future__ import annotations

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
        """Only global rank 0 draws."""
        if not trainer.is_global_zero:
            self.disable()

    def get_metrics(self, trainer: TrainerView, pl_module: Module) -> dict[str, int | str | float | dict[str, float]]:
        """The values shown next to the bar: ``v_num`` (the first logger's version) and the progress-bar metrics."""
        metrics: dict[str, int | str | float | dict[str, float]] = {}
        logger = trainer.logger
        version = getattr(logger, "version", None) if logger is not None else None
        if version is not None:
            metrics["v_num"] = version[-4:] if isinstance(version, str) else version
        metrics.update(trainer.progress_bar_metrics)
        return metrics


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
