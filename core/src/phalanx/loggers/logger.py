"""The Logger base class: where scalar metrics go.

The Trainer aggregates metrics and calls loggers on global rank 0 only, so a logger never has to
think about processes. Methods mirror Lightning's ``Logger`` so existing loggers port easily.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from functools import wraps
from typing import Any

from phalanx.utilities.rank_zero import rank_zero_only

__all__ = ["DummyExperiment", "Logger", "rank_zero_experiment"]


class DummyExperiment:
    """What ``logger.experiment`` is on ranks other than 0: every method call does nothing.

    User code such as ``self.logger.experiment.add_image(...)`` runs on every rank; only rank 0
    may create run directories or backend runs, so the other ranks get this stand-in, as in Lightning.
    """

    def nop(self, *args: Any, **kwargs: Any) -> None:
        """Accept any call and do nothing."""

    def __getattr__(self, _: str) -> Callable[..., None]:
        return self.nop

    def __getitem__(self, idx: int) -> DummyExperiment:
        return self

    def __setitem__(self, *args: Any) -> None:
        pass


def rank_zero_experiment(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Decorate an ``experiment`` getter: the real object on global rank 0, a :class:`DummyExperiment` elsewhere."""

    @wraps(fn)
    def experiment(self: Any) -> Any:
        if rank_zero_only.rank > 0:
            return DummyExperiment()
        return fn(self)

    return experiment


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

    @property
    def group_separator(self) -> str:
        """The character that groups metric names in dashboards (``train/loss``)."""
        return "/"

    def log_hyperparams(self, params: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:  # noqa: B027 - optional
        """Record hyperparameters; ignored by default."""

    def log_graph(self, model: Any, input_array: Any = None) -> None:  # noqa: B027 - optional
        """Record the model's computational graph (the Trainer calls it once at the start of fit); ignored by default."""

    def save(self) -> None:  # noqa: B027 - optional
        """Flush buffered data."""

    def finalize(self, status: str) -> None:
        """Called at the end of a stage with ``"success"`` or ``"failed"``; flushes by default."""
        self.save()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:  # noqa: B027 - optional
        """Called after a ModelCheckpoint wrote a file."""
