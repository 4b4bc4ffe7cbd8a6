"""``lightning.pytorch.callbacks.spike``: :class:`SpikeDetection` (it lives in :mod:`phalanx.callbacks.spike_detection`)."""

from __future__ import annotations

from phalanx.callbacks.spike_detection import SpikeDetection

__all__ = ["SpikeDetection"]
