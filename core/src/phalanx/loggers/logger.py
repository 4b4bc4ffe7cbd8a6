"""The Logger base class: where scalar metrics go.

The Trainer aggregates metrics and calls loggers on global rank 0 only, so a logger never has to
think about processes. Methods mirror Lightning's ``Logger`` so existing loggers port easily.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

__all__ = ["Logger"]


class Logger(ABC):
    """Receives metrics (and optionally hyperparameters) from the Trainer on global rank 0."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Experiment name."""

    @property
    @abstractmethod
    def version(self) -> int | str:
        """Experiment version (e.g. an increasing integer)."""

    @property
    def save_dir(self) -> str | None:
        """Root directory of this logger's files, if it writes any."""
        return None

    @property
    def log_dir(self) -> str | None:
        """Directory of this run's files (checkpoints default to ``<log_dir>/checkpoints``)."""
        return None

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (name -> number) at optimizer step ``step``."""

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:  # noqa: B027 - optional
        """Record hyperparameters; ignored by default."""

    def save(self) -> None:  # noqa: B027 - optional
        """Flush buffered data."""

    def finalize(self, status: str) -> None:
        """Called at the end of a stage with ``"success"`` or ``"failed"``; flushes by default."""
        self.save()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:  # noqa: B027 - optional
        """Called after a ModelCheckpoint wrote a file."""
