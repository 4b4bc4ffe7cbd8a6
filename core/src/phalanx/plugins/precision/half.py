"""``lightning.pytorch.plugins.precision.half``: :class:`HalfPrecision`, float16 / bfloat16 weights and inputs (true half precision) (:mod:`phalanx.precision.half`)."""

from __future__ import annotations

from phalanx.precision.half import HalfPrecision

__all__ = ["HalfPrecision"]
