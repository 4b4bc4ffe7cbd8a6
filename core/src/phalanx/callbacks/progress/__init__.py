"""Progress bars (Lightning's ``lightning.pytorch.callbacks.progress`` package).

:class:`ProgressBar` is the base class (:mod:`phalanx.callbacks.progress_bar`), :class:`TQDMProgressBar`
the default bar (:mod:`.tqdm_progress`), :class:`RichProgressBar` the ``rich`` one
(:mod:`phalanx.callbacks.rich_progress`; ``rich`` is imported when one is built). The submodules
``progress_bar``, ``tqdm_progress`` and ``rich_progress`` are Lightning's paths to the same classes.
"""

from __future__ import annotations

from phalanx.callbacks.progress.progress_bar import ProgressBar, get_standard_metrics
from phalanx.callbacks.progress.rich_progress import RichProgressBar, RichProgressBarTheme
from phalanx.callbacks.progress.tqdm_progress import Tqdm, TQDMProgressBar, convert_inf

__all__ = [
    "ProgressBar",
    "RichProgressBar",
    "RichProgressBarTheme",
    "TQDMProgressBar",
    "Tqdm",
    "convert_inf",
    "get_standard_metrics",
]
