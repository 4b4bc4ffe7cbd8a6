"""Trainer callbacks: the base class and the built-in ones, under Lightning's names.

Each is written on the public :class:`~phalanx.trainer_view.TrainerView` alone, as a third-party
callback would be, and most are also registered by name (``Trainer(callbacks=["early_stopping"])``,
``phalanx plugins`` lists them). Optional libraries (rich, matplotlib) are imported when a callback
that needs them is built, never here.
"""

from __future__ import annotations

from phalanx.callbacks.batch_size_finder import BatchSizeFinder
from phalanx.callbacks.callback import Callback
from phalanx.callbacks.checkpoint import Checkpoint
from phalanx.callbacks.device_stats_monitor import DeviceStatsMonitor
from phalanx.callbacks.early_stopping import EarlyStopping
from phalanx.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
from phalanx.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from phalanx.callbacks.lambda_function import LambdaCallback
from phalanx.callbacks.lr_finder import LearningRateFinder
from phalanx.callbacks.lr_monitor import LearningRateMonitor
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.callbacks.model_summary import ModelSummary
from phalanx.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
from phalanx.callbacks.prediction_writer import BasePredictionWriter
from phalanx.callbacks.progress import TQDMProgressBar
from phalanx.callbacks.progress_bar import ProgressBar
from phalanx.callbacks.pruning import ModelPruning
from phalanx.callbacks.rich_model_summary import RichModelSummary
from phalanx.callbacks.rich_progress import RichProgressBar
from phalanx.callbacks.spike_detection import SpikeDetection
from phalanx.callbacks.stochastic_weight_avg import StochasticWeightAveraging
from phalanx.callbacks.throughput_monitor import ThroughputMonitor
from phalanx.callbacks.timer import Timer
from phalanx.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "Callback",
    "Checkpoint",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelPruning",
    "ModelSummary",
    "OnExceptionCheckpoint",
    "ProgressBar",
    "RichModelSummary",
    "RichProgressBar",
    "SpikeDetection",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "ThroughputMonitor",
    "Timer",
    "WeightAveraging",
]
