"""``lightning.pytorch.callbacks.progress.rich_progress``: the ``rich`` progress bar and its theme.

The classes live in :mod:`phalanx.callbacks.rich_progress`; ``rich`` is imported when a bar is built.
"""

from __future__ import annotations

from phalanx.callbacks.rich_progress import RichProgressBar, RichProgressBarTheme

__all__ = ["RichProgressBar", "RichProgressBarTheme"]
