"""``lightning.pytorch.callbacks.progress.progress_bar``: the progress-bar base class and its standard metrics.

:class:`ProgressBar` lives in :mod:`phalanx.callbacks.progress_bar`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.callbacks.progress_bar import ProgressBar

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["ProgressBar", "get_standard_metrics"]


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
