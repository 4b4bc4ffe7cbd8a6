"""``lightning.pytorch.plugins.precision.amp``: :class:`MixedPrecision` (:mod:`phalanx.precision.amp`).

Automatic mixed precision: autocast, with a gradient scaler for float16.
"""

from __future__ import annotations

from phalanx.precision.amp import MixedPrecision

__all__ = ["MixedPrecision"]
