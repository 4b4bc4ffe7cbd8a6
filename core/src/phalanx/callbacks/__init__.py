"""Trainer callbacks: the base class, checkpointing and the progress bar."""

from __future__ import annotations

from phalanx.callbacks.callback import Callback
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.callbacks.progress import TQDMProgressBar

__all__ = ["Callback", "ModelCheckpoint", "TQDMProgressBar"]
