"""``lightning.pytorch.plugins.precision.precision``: :class:`Precision`, the precision base class (:mod:`phalanx.precision.precision`)."""

from __future__ import annotations

from phalanx.precision.precision import Precision

__all__ = ["Precision"]
