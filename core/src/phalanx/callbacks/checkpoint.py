"""Checkpoint: the base class of callbacks that write checkpoints.

The Trainer and other callbacks recognise checkpointing callbacks by this type (Lightning's
``lightning.pytorch.callbacks.Checkpoint``), whatever policy a subclass implements: keep the best
(:class:`~phalanx.callbacks.model_checkpoint.ModelCheckpoint`), save when fit fails
(:class:`~phalanx.callbacks.on_exception_checkpoint.OnExceptionCheckpoint`), or a user's own.
"""

from __future__ import annotations

from phalanx.callbacks.callback import Callback

__all__ = ["Checkpoint"]


class Checkpoint(Callback):
    """Base class for checkpointing callbacks; it adds no behaviour, only the type."""
