"""CSVLogger: metrics in a plain ``metrics.csv``, readable with any tool and no dependency.

Files go to ``<save_dir>/<name>/version_<N>/metrics.csv``; ``N`` is the next free number so runs
never overwrite each other (a ``version`` you name yourself is reused: its old ``metrics.csv`` is
replaced, with a warning, as in Lightning). The writing is done by an :class:`ExperimentWriter`
(``logger.experiment``), Lightning's name for it: rows are buffered and flushed every
``flush_logs_every_n_steps`` so logging costs no file I/O on most steps. When a metric appears that
the header lacks, the file is rewritten with the widened header, so every row stays aligned with its
columns. ``save_dir`` may be an fsspec URL (``memory://``, ``s3://bucket/run``): object stores cannot
append, so there every flush rewrites the whole file in one upload.
"""

from __future__ import annotations

import csv
import io
import os
import re
import warnings
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from phalanx.errors import MisconfigurationError, PhalanxError
from phalanx.loggers.logger import Logger, rank_zero_experiment
from phalanx.utilities.paths import check_path, filesystem, is_remote, join, remote_error
from phalanx.utilities.rank_zero import rank_zero_only

__all__ = ["CSVLogger", "ExperimentWriter", "write_hparams_yaml"]

_VERSION_DIR = re.compile(r"^version_(\d+)$")


def _plain(value: Any) -> Any:
    """``value`` as YAML can write it safely: containers kept, anything else as its ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return str(value)


def write_hparams_yaml(path: str, hparams: Mapping[str, Any]) -> None:
    """Write ``hparams`` to ``path`` as YAML (``Module.load_from_checkpoint(hparams_file=...)`` reads it)."""
    import fsspec
    import yaml

    with fsspec.open(path, "w") as handle:
        yaml.safe_dump(_plain(dict(hparams)), handle, sort_keys=False)


def _scalar(value: Any) -> Any:
    """A one-element tensor (or numpy scalar) as its Python number; anything else unchanged."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _column_order(key: str) -> tuple[bool, bool, str]:
    """``epoch`` and ``step`` first, then the metrics by name: the columns a reader looks for first."""
    return (key != "epoch", key != "step", key)


class ExperimentWriter:
    """Writes one run's ``metrics.csv`` and ``hparams.yaml`` into ``log_dir`` (``CSVLogger.experiment``).

    Creating it creates ``log_dir``. When ``log_dir`` already holds files (a ``version`` named
    again), it warns and removes the old ``metrics.csv``, so the new run's rows are not mixed into an
    old run's file.

    Args:
        log_dir: The run's folder; a local path or an fsspec URL.
    """

    NAME_METRICS_FILE = "metrics.csv"
    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.metrics: list[dict[str, Any]] = []
        self.metrics_keys: list[str] = []
        self.hparams: dict[str, Any] = {}
        self.metrics_file_path = join(log_dir, self.NAME_METRICS_FILE)
        self._remote = is_remote(log_dir)
        self._fs, self._inner = filesystem(log_dir)
        self._metrics_inner = filesystem(self.metrics_file_path)[1]
        if self._remote:
            self._fs.invalidate_cache()
        if self._fs.exists(self._inner) and self._fs.ls(self._inner):
            warnings.warn(
                f"Experiment logs directory {log_dir} exists and is not empty; its metrics.csv is"
                " replaced by this run's. Pass another `version` (or none, for the next free one) to keep it.",
                UserWarning,
                stacklevel=2,
            )
            if self._fs.isfile(self._metrics_inner):
                self._fs.rm_file(self._metrics_inner)
        self._fs.makedirs(self._inner, exist_ok=True)

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        """Add ``params`` to the run's hyperparameters and write ``hparams.yaml`` now."""
        self.hparams.update(params)
        write_hparams_yaml(join(self.log_dir, self.NAME_HPARAMS_FILE), self.hparams)

    def log_metrics(self, metrics_dict: Mapping[str, Any], step: int | None = None) -> None:
        """Buffer one row; ``step`` defaults to the number of rows buffered so far."""
        if step is None:
            step = len(self.metrics)
        row = {key: _scalar(value) for key, value in metrics_dict.items()}
        row["step"] = step
        self.metrics.append(row)

    def save(self) -> None:
        """Write the buffered rows: appended, or the whole file rewritten when the header widened.

        A store (URL) cannot append, so there the file is always rewritten in one upload.
        """
        if not self.metrics:
            return
        new_keys = [key for row in self.metrics for key in row if key not in self.metrics_keys]
        self.metrics_keys.extend(dict.fromkeys(new_keys))
        self.metrics_keys.sort(key=_column_order)
        exists = self._fs.isfile(self._metrics_inner)
        if exists and (new_keys or self._remote):
            with self._fs.open(self._metrics_inner, "r", newline="") as handle:
                rows: list[dict[str, Any]] = list(csv.DictReader(handle))
            rows.extend(self.metrics)
            self._write(rows, mode="w")
        else:
            self._write(self.metrics, mode="a" if exists else "w")
        self.metrics = []

    def _write(self, rows: list[dict[str, Any]], *, mode: str) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self.metrics_keys, restval="")
        if mode == "w":
            writer.writeheader()
        writer.writerows(rows)
        with self._fs.open(self._metrics_inner, mode, newline="") as handle:
            handle.write(text.getvalue())


class CSVLogger(Logger):
    """Log metrics to CSV and hyperparameters to YAML.

    Args:
        save_dir: Root directory (the Trainer passes ``default_root_dir``).
        name: Subdirectory for this experiment; default ``"lightning_logs"``. ``""`` or None puts
            the versions directly in ``save_dir``.
        version: Fixed version (int or str); None picks the next free ``version_N``.
        prefix: Put ``<prefix>-`` in front of every metric name.
        flush_logs_every_n_steps: Write buffered rows every N calls of :meth:`log_metrics`.

    Raises:
        MisconfigurationError: Invalid argument types.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        if not isinstance(save_dir, (str, os.PathLike)):
            msg = f"CSVLogger(save_dir={save_dir!r}) must be a path (str or os.PathLike)."
            raise MisconfigurationError(msg)
        if (
            isinstance(flush_logs_every_n_steps, bool)
            or not isinstance(flush_logs_every_n_steps, int)
            or flush_logs_every_n_steps < 1
        ):
            msg = f"CSVLogger(flush_logs_every_n_steps={flush_logs_every_n_steps!r}) must be an int >= 1."
            raise MisconfigurationError(msg)
        self._save_dir = check_path(save_dir, argument="CSVLogger(save_dir=...)")
        self._name = name or ""
        self._version = version
        self._prefix = prefix
        self._flush_every = flush_logs_every_n_steps
        self._calls = 0
        self._experiment: ExperimentWriter | None = None

    @property
    def name(self) -> str:
        """Experiment directory name."""
        return self._name

    @property
    def save_dir(self) -> str:
        """The root directory."""
        return self._save_dir

    @property
    def version(self) -> int | str:
        """This run's version; the next free integer, fixed on first access."""
        if self._version is None:
            self._version = self._next_version()
        return self._version

    @property
    def root_dir(self) -> str:
        """``<save_dir>/<name>``: where the ``version_N`` folders are."""
        return join(self._save_dir, self._name) if self._name else self._save_dir

    @property
    def log_dir(self) -> str:
        """``<save_dir>/<name>/version_<N>``."""
        version = self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        return join(self.root_dir, folder)

    @property
    def metrics_file_path(self) -> str:
        """Path of ``metrics.csv``."""
        return join(self.log_dir, ExperimentWriter.NAME_METRICS_FILE)

    @property
    def hparams(self) -> dict[str, Any]:
        """The hyperparameters logged so far."""
        return self._experiment.hparams if self._experiment is not None else {}

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        """The :class:`ExperimentWriter` of this run, created (with its folder) on first use."""
        if self._experiment is None:
            self._experiment = self._guarded(lambda: ExperimentWriter(self.log_dir), "create the CSV log folder")
        return self._experiment

    def _next_version(self) -> int:
        fs, root_path = filesystem(self.root_dir)
        if is_remote(self._save_dir):
            fs.invalidate_cache()
        try:
            entries = fs.ls(root_path, detail=True)
        except FileNotFoundError:
            return 0
        names = [e["name"].rstrip("/").rpartition("/")[2] for e in entries if e.get("type") == "directory"]
        found = [int(m.group(1)) for name in names if (m := _VERSION_DIR.match(name))]
        return max(found) + 1 if found else 0

    def _guarded(self, action: Any, what: str) -> Any:
        """Run ``action``; a store's own error (endpoint, credentials) becomes one error naming the URL."""
        if not is_remote(self._save_dir):
            return action()
        try:
            return action()
        except Exception as error:  # the store's own errors vary by backend
            raise PhalanxError(remote_error(self.log_dir, error, action=what, untouched=False)) from error

    @rank_zero_only
    def log_hyperparams(  # type: ignore[override]
        self, params: Mapping[str, Any] | Namespace | None = None, *args: Any, **kwargs: Any
    ) -> None:
        """Record hyperparameters; ``hparams.yaml`` in :attr:`log_dir` is written at once."""
        values = vars(params) if isinstance(params, Namespace) else dict(params or {})
        self._guarded(lambda: self.experiment.log_hparams(values), "write hparams.yaml")

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:  # type: ignore[override]
        """Buffer one row; flush every ``flush_logs_every_n_steps`` calls."""
        if self._prefix:
            metrics = {f"{self._prefix}{self.LOGGER_JOIN_CHAR}{k}": v for k, v in metrics.items()}
        self.experiment.log_metrics(metrics, step)
        self._calls += 1
        if self._calls % self._flush_every == 0:
            self.save()

    @rank_zero_only
    def save(self) -> None:
        """Write the buffered rows (and create the run folder, which reserves this version).

        Raises:
            PhalanxError: A store (``save_dir`` is a URL) could not be written; the message names
                the URL and the store's own error.
        """
        self._guarded(lambda: self.experiment.save(), "write the CSV log")

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Flush everything at the end of a stage (nothing to do if this process never logged)."""
        if self._experiment is not None:
            self.save()
