"""Precisions: how a strategy casts, autocasts, scales and steps (32/64/16/bf16, true or mixed; float8)."""

from __future__ import annotations

from phalanx.precision.amp import MixedPrecision
from phalanx.precision.double import DoublePrecision
from phalanx.precision.float8 import Float8Precision
from phalanx.precision.half import HalfPrecision
from phalanx.precision.precision import Precision

__all__ = ["DoublePrecision", "Float8Precision", "HalfPrecision", "MixedPrecision", "Precision"]
