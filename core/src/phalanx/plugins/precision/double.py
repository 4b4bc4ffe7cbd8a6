"""``lightning.pytorch.plugins.precision.double``: :class:`DoublePrecision`, float64 weights and inputs (:mod:`phalanx.precision.double`)."""

from __future__ import annotations

from phalanx.precision.double import DoublePrecision

__all__ = ["DoublePrecision"]
