"""Trainer callbacks: the base class and the built-in ones, under Lightning's names."""

from __future__ import annotations

from phalanx.callbacks.callback import Callback
from phalanx.callbacks.early_stopping import EarlyStopping
from phalanx.callbacks.lambda_function import LambdaCallback
from phalanx.callbacks.lr_monitor import LearningRateMonitor
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.callbacks.model_summary import ModelSummary
from phalanx.callbacks.progress import TQDMProgressBar
from phalanx.callbacks.timer import Timer

__all__ = [
    "Callback",
    "EarlyStopping",
    "LambdaCallback",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "TQDMProgressBar",
    "Timer",
]
