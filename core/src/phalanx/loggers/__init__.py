"""Loggers: where the Trainer sends metrics (global rank 0 only)."""

from __future__ import annotations

from phalanx.loggers.csv_logs import CSVLogger
from phalanx.loggers.logger import Logger

__all__ = ["CSVLogger", "Logger"]
