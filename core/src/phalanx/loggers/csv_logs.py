"""CSVLogger: metrics in a plain ``metrics.csv``, readable with any tool and no dependency.

Files go to ``<save_dir>/<name>/version_<N>/metrics.csv``; ``N`` is the next free number so runs
never overwrite each other. Rows are buffered and flushed every ``flush_logs_every_n_steps`` so
logging costs no file I/O on most steps. When a metric appears that the header lacks, the file is
rewritten with the widened header, so every row stays aligned with its columns. ``save_dir`` may be
an fsspec URL (``s3://bucket/run``): object stores cannot append, so there every flush rewrites the
whole file in one upload.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phalanx.errors import MisconfigurationError, PhalanxError
from phalanx.loggers.logger import Logger
from phalanx.utilities.paths import check_path, filesystem, is_remote, join, remote_error

__all__ = ["CSVLogger", "write_hparams_yaml"]

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


class CSVLogger(Logger):
    """Log metrics to CSV.

    Args:
        save_dir: Root directory (the Trainer passes ``default_root_dir``).
        name: Subdirectory for this experiment; default ``"phalanx_logs"``. ``""`` or None puts
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
        *,
        name: str | None = "phalanx_logs",
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
        self._rows: list[dict[str, Any]] = []
        self._written_rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._calls = 0
        self.hparams: dict[str, Any] = {}

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
        return join(self.log_dir, "metrics.csv")

    def _next_version(self) -> int:
        if is_remote(self._save_dir):
            fs, root_path = filesystem(self.root_dir)
            fs.invalidate_cache()
            try:
                entries = fs.ls(root_path, detail=True)
            except FileNotFoundError:
                return 0
            names = [e["name"].rstrip("/").rpartition("/")[2] for e in entries if e.get("type") == "directory"]
        else:
            root = Path(self._save_dir) / self._name
            if not root.is_dir():
                return 0
            names = [p.name for p in root.iterdir() if p.is_dir()]
        found = [int(m.group(1)) for name in names if (m := _VERSION_DIR.match(name))]
        return max(found) + 1 if found else 0

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Keep hyperparameters; written to ``hparams.yaml`` in :attr:`log_dir` on save."""
        self.hparams.update(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Buffer one row; flush every ``flush_logs_every_n_steps`` calls."""
        row: dict[str, Any] = {"step": step}
        row.update(
            metrics
            if not self._prefix
            else {f"{self._prefix}{self.LOGGER_JOIN_CHAR}{k}": v for k, v in metrics.items()}
        )
        self._rows.append(row)
        self._calls += 1
        if self._calls % self._flush_every == 0:
            self.save()

    def save(self) -> None:
        """Append buffered rows, rewriting the file when new columns appeared.

        Also creates the run directory, which reserves this version for the run.

        Raises:
            PhalanxError: A store (``save_dir`` is a URL) could not be written; the message names
                the URL and the store's own error.
        """
        if not is_remote(self._save_dir):
            self._save()
            return
        try:
            self._save()
        except Exception as error:  # the store's own errors (endpoint, credentials) vary by backend
            raise PhalanxError(
                remote_error(self.log_dir, error, action="write the CSV log", untouched=False)
            ) from error

    def _save(self) -> None:
        """Append buffered rows, rewriting the file when new columns appeared."""
        remote = is_remote(self._save_dir)
        if remote:
            fs, inner = filesystem(self.log_dir)
            fs.makedirs(inner, exist_ok=True)
        else:
            os.makedirs(self.log_dir, exist_ok=True)
        if self.hparams:
            write_hparams_yaml(join(self.log_dir, "hparams.yaml"), self.hparams)
        if not self._rows:
            return
        new_keys = [key for row in self._rows for key in row if key not in self._columns]
        rewrite = bool(new_keys) or not self._written_rows or remote
        for key in dict.fromkeys(new_keys):
            self._columns.append(key)
        self._columns.sort(key=lambda k: (k != "epoch", k != "step", k))
        rows = self._written_rows + self._rows if rewrite else self._rows
        import fsspec

        with fsspec.open(self.metrics_file_path, "w" if rewrite else "a", newline="") as handle:
            dict_writer = csv.DictWriter(handle, fieldnames=self._columns, restval="")
            if rewrite:
                dict_writer.writeheader()
            dict_writer.writerows(rows)
        self._written_rows.extend(self._rows)
        self._rows = []

    def finalize(self, status: str) -> None:
        """Flush everything at the end of a stage."""
        self.save()
