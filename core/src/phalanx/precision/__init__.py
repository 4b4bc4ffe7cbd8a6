"""Precisions: how a strategy casts, autocasts, scales and steps (32/64/16/bf16, true or mixed)."""

from __future__ import annotations

from phalanx.precision.amp import MixedPrecision
from phalanx.precision.double import DoublePrecision
from phalanx.precision.half import HalfPrecision
from phalanx.precision.precision import Precision

__all__ = ["DoublePrecision", "HalfPrecision", "MixedPrecision", "Precision"]
