"""``lightning.pytorch.callbacks.progress.progress_bar``: the progress-bar base class and its standard metrics.

Both live in :mod:`phalanx.callbacks.progress_bar`.
"""

from __future__ import annotations

from phalanx.callbacks.progress_bar import ProgressBar, get_standard_metrics

__all__ = ["ProgressBar", "get_standard_metrics"]
