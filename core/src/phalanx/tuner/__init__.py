"""Tuning before training: the learning-rate range test and the batch-size search (Lightning's ``Tuner``)."""

from __future__ import annotations

from phalanx.tuner.tuning import Tuner

__all__ = ["Tuner"]
