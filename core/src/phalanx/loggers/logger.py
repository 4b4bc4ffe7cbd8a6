"""The Logger base class: where scalar metrics go.

The Trainer aggregates metrics and calls loggers on global rank 0 only, so a logger never has to
think about processes. Methods mirror Lightning's ``Logger`` so existing loggers port easily.
"""

from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from functools import wraps
from typing import Any

from phalanx.utilities.rank_zero import rank_zero_only

__all__ = ["DummyExperiment", "DummyLogger", "Logger", "merge_dicts", "rank_zero_experiment"]


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
    """Receives metrics (and optionally hyperparameters) from the Trainer, on every rank as in Lightning.

    A logger that should write once per job decorates its writing methods with ``rank_zero_only``
    (phalanx's loggers do); one that records per rank need not.
    """

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


class DummyLogger(Logger):
    """A logger that records nothing and accepts every call, for code that must run with logging off.

    ``name`` and ``version`` are empty, ``experiment`` is a :class:`DummyExperiment`,
    ``logger[0]`` is the logger itself, and any method a backend-specific logger would have
    (``logger.log_image(...)``, ``logger.watch(model)``) exists and does nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self._experiment = DummyExperiment()

    @property
    def experiment(self) -> DummyExperiment:
        """A stand-in whose every method does nothing."""
        return self._experiment

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:
        """Drop the metrics."""

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        """Drop the hyperparameters."""

    def __getitem__(self, idx: int) -> DummyLogger:
        return self

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):  # keep copy/pickle protocols from seeing a method for every dunder
            raise AttributeError(name)

        def ignore(*args: Any, **kwargs: Any) -> None:
            return None

        return ignore


def merge_dicts(
    dicts: Sequence[Mapping[Any, Any]],
    agg_key_funcs: Mapping[Any, Any] | None = None,
    default_func: Callable[[Sequence[float]], float] = statistics.mean,
) -> dict[Any, Any]:
    """Merge dictionaries key by key, combining each key's values with a function.

    Args:
        dicts: The dictionaries; a key may be missing or None in some of them (those are skipped).
        agg_key_funcs: The function for a key's values (a nested mapping of functions for a key whose
            values are dicts); keys not listed use ``default_func``.
        default_func: How the values of any other key are combined; the mean by default.

    Returns:
        One dict with every key of ``dicts``; a key whose values are dicts is merged recursively.
    """
    functions = agg_key_funcs or {}
    keys: dict[Any, None] = {}
    for each in dicts:
        keys.update(dict.fromkeys(each))
    merged: dict[Any, Any] = {}
    for key in keys:
        values = [each[key] for each in dicts if each.get(key) is not None]
        if not values:
            continue
        function = functions.get(key)
        if isinstance(values[0], dict):
            merged[key] = merge_dicts(values, function, default_func)
        else:
            merged[key] = (function or default_func)(values)
    return merged
