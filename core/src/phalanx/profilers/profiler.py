"""The Profiler base class and the do-nothing profiler the Trainer uses by default.

The Trainer wraps every hook, step and data fetch in ``with profiler.profile(action_name):`` and
knows nothing else about how time is measured; a profiler only decides what ``start`` and
``stop`` record and how :meth:`Profiler.summary` reports it. That keeps profilers pluggable (a
user's subclass of :class:`Profiler` works like the built-in ones) and lets the default
:class:`PassThroughProfiler` cost next to nothing on the hot path.

Names, arguments, action names and the report's layout follow Lightning's profilers, so a
Lightning script's ``Trainer(profiler="simple")`` or ``SimpleProfiler(dirpath=..., filename=...)``
runs unchanged. This module imports no torch.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = ["PassThroughProfiler", "Profiler"]


class _Action:
    """``with profiler.profile(name)``: a plain class is cheaper than a generator context manager,
    and this object is entered once per hook call."""

    __slots__ = ("_name", "_profiler")

    def __init__(self, profiler: Profiler, name: str) -> None:
        self._profiler = profiler
        self._name = name

    def __enter__(self) -> str:
        self._profiler.start(self._name)
        return self._name

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._profiler.stop(self._name)


class _Nothing:
    """The context :class:`PassThroughProfiler` hands out: one shared object, no calls inside."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


_NOTHING = _Nothing()


class Profiler(ABC):
    """Base class of profilers: subclass it and implement :meth:`start`, :meth:`stop`, :meth:`summary`.

    The Trainer calls :meth:`setup` when a stage (``"fit"``, ``"validate"``...) starts, wraps each
    action in :meth:`profile`, and calls :meth:`describe` when the stage ends, which writes the
    report and then :meth:`teardown`.

    Args:
        dirpath: Folder (a local path or an fsspec URL) for the report. Without it, the Trainer's
            ``log_dir`` is used once :meth:`setup` runs.
        filename: Report file name, without extension (``.txt`` is added and the stage prefixed:
            ``fit-<filename>.txt``). Without it, the report is printed on local rank 0 instead.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._output_file: IO[str] | None = None
        self._local_rank: int | None = None
        self._stage: str | None = None

    # ------------------------------------------------------------------ what subclasses define
    @abstractmethod
    def start(self, action_name: str) -> None:
        """Begin recording ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """Finish recording ``action_name`` (started by :meth:`start`)."""

    def summary(self) -> str:
        """The report of everything recorded since :meth:`setup`; empty when there is nothing."""
        return ""

    # ------------------------------------------------------------------ what the Trainer calls
    def profile(self, action_name: str) -> Any:
        """Context manager recording the code it wraps as ``action_name``; yields the name.

        Example::

            with profiler.profile("load training data"):
                batch = next(iterator)
        """
        return _Action(self, action_name)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Remember the stage and rank (they name the report) and default ``dirpath`` to ``log_dir``.

        Args:
            stage: The Trainer entry point (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``).
            local_rank: This process's local rank; ``None`` in a single-process run, which keeps
                the rank out of file names.
            log_dir: The Trainer's log directory, used when ``dirpath`` was not given.
        """
        self._stage = _plain(stage)
        self._local_rank = local_rank
        self.dirpath = self.dirpath or log_dir

    def describe(self) -> None:
        """Write the report (to ``dirpath/<stage>-<filename>.txt``, else print it on local rank 0),
        then :meth:`teardown`.

        Usable without a Trainer: the file is opened and closed here, not in :meth:`setup`.
        """
        text = self.summary()
        if text:
            if self.filename and self.dirpath:
                stream = self._open_output()
                stream.write(text)
                stream.flush()
            elif self._local_rank in (None, 0):
                print(text)
        self.teardown(stage=self._stage)

    def teardown(self, stage: str | None) -> None:
        """Release what the stage held (open report file; recorders in subclasses). Safe to call twice."""
        if self._output_file is not None:
            self._output_file.close()
            self._output_file = None

    @property
    def local_rank(self) -> int:
        """The local rank given to :meth:`setup` (0 in a single-process run)."""
        return 0 if self._local_rank is None else self._local_rank

    def __del__(self) -> None:
        if "_stage" in self.__dict__:  # not when __init__ failed half-way
            self.teardown(stage=self._stage)

    # ------------------------------------------------------------------ helpers for subclasses
    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """``<stage>-<filename>-<local rank>-<action>`` with path-unsafe characters replaced by ``_``."""
        parts = [str(p) for p in (self._stage, self.filename, self._local_rank, action_name) if p not in (None, "")]
        base = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", "-".join(parts))).strip()
        return (base or "profile") + extension

    def _output_path(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """Where a file of this run goes: ``dirpath/<prepared name>``; creates ``dirpath``."""
        if self.dirpath is None:
            msg = (
                f"{type(self).__name__} has no dirpath to write {self._prepare_filename(action_name, extension)!r} to: "
                "pass dirpath=... or let the Trainer set it from its log_dir"
            )
            raise ValueError(msg)
        dirpath = str(self.dirpath)
        _filesystem(dirpath).makedirs(dirpath, exist_ok=True)
        return dirpath.rstrip("/") + "/" + self._prepare_filename(action_name, extension)

    def _open_output(self) -> IO[str]:
        """The report file, opened for appending (reports of later stages follow earlier ones)."""
        if self._output_file is None:
            path = self._output_path()
            self._output_file = _filesystem(path).open(path, "a")
        return self._output_file

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        """The report layout the cProfile and torch profilers share: a title, then one block per action."""
        title = f"{self._stage.upper()} Profiler Report" if self._stage is not None else "Profiler Report"
        rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
        lines = [title]
        for action, text in stats.items():
            lines += [f"Profile stats for: {action}{rank}", text]
        return os.linesep.join(lines)


class PassThroughProfiler(Profiler):
    """The Trainer's default: records nothing, and :meth:`profile` returns one shared no-op context."""

    def start(self, action_name: str) -> None:
        """Record nothing."""

    def stop(self, action_name: str) -> None:
        """Record nothing."""

    def profile(self, action_name: str) -> Any:
        """A shared context that does nothing (no allocation, no call) on each hook."""
        return _NOTHING


def _plain(stage: Any) -> str | None:
    """``TrainerFn.FITTING`` -> ``"fit"``: enums format differently across Python versions."""
    if stage is None:
        return None
    return str(stage.value) if isinstance(stage, Enum) else str(stage)


def _filesystem(path: str) -> Any:
    """The fsspec filesystem of ``path`` (local for plain paths; ``s3://`` needs s3fs, and says so)."""
    from fsspec.core import url_to_fs  # fsspec is a torch dependency; imported only when writing

    try:
        return url_to_fs(path)[0]
    except ImportError as error:
        msg = f"cannot write profiler output to {path!r}: {error}. Install the filesystem package it names."
        raise ImportError(msg) from error
