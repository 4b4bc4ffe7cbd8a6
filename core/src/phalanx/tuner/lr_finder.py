"""Lightning's module path for the LR finder's result object: ``lightning.pytorch.tuner.lr_finder._LRFinder``.

The search itself lives in :mod:`phalanx.callbacks.lr_finder` (the callback runs it); this module
re-exports what a ported script may import from here.
"""

from __future__ import annotations

from phalanx.callbacks.lr_finder import _LRFinder, lr_at

__all__ = ["_LRFinder", "lr_at"]
