"""Loggers: where the Trainer sends metrics (global rank 0 only).

Each backend (tensorboard, mlflow, wandb) is imported when its logger is built, never here, so
``import phalanx.loggers`` costs nothing and a missing backend fails with the install line.
"""

from __future__ import annotations

from phalanx.loggers.csv_logs import CSVLogger
from phalanx.loggers.logger import Logger
from phalanx.loggers.mlflow import MLFlowLogger
from phalanx.loggers.tensorboard import TensorBoardLogger
from phalanx.loggers.wandb import WandbLogger

__all__ = ["CSVLogger", "Logger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]
