"""AdvancedProfiler: Python's cProfile per action, reported as pstats tables.

When the SimpleProfiler shows *which* action is slow, this one shows *which functions inside it*
are: one ``cProfile.Profile`` per action name, sorted by cumulative time. It is verbose and slows
Python code noticeably, so it is for diagnosis, not for every run.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import tempfile
from pathlib import Path
from typing import Any

from phalanx.profilers.profiler import Profiler, _filesystem

__all__ = ["AdvancedProfiler"]


class AdvancedProfiler(Profiler):
    """Profile each action's Python calls with cProfile.

    Only one cProfile may be active at a time, so starting an action pauses the one around it and
    stopping it resumes the outer one: nested actions (a training step inside the batch) each see
    their own calls.

    Args:
        dirpath: Folder of the report file (see :class:`~phalanx.profilers.Profiler`).
        filename: Report file name without extension; without it the report is printed.
        line_count_restriction: How many functions to list per action: an int count, or a
            fraction between 0.0 and 1.0 of all of them.
        dump_stats: Also write each action's raw stats (``<stage>-<filename>-<action>.prof``,
            readable by ``pstats`` or snakeviz) to ``dirpath``.

    Raises:
        ValueError: An action is stopped without having been started.
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        line_count_restriction: float = 1.0,
        dump_stats: bool = False,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self._running: list[str] = []  # innermost last; only its profile is enabled

    def start(self, action_name: str) -> None:
        """Pause the running action's profile and enable this one's."""
        if self._running:
            self.profiled_actions[self._running[-1]].disable()
        self.profiled_actions.setdefault(action_name, cProfile.Profile()).enable()
        self._running.append(action_name)

    def stop(self, action_name: str) -> None:
        """Disable this action's profile and resume the one it interrupted."""
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            msg = f"Attempting to stop recording an action ({action_name!r}) which was never started: call start first"
            raise ValueError(msg)
        profile.disable()
        if action_name in self._running:
            del self._running[len(self._running) - 1 - self._running[::-1].index(action_name)]
        if self._running:
            self.profiled_actions[self._running[-1]].enable()

    def summary(self) -> str:
        """One pstats table per action, sorted by cumulative time."""
        stats = {}
        for action_name, profile in self.profiled_actions.items():
            if self.dump_stats:
                self._write_raw_stats(action_name, profile)
            stream = io.StringIO()
            pstats.Stats(profile, stream=stream).strip_dirs().sort_stats("cumulative").print_stats(
                self.line_count_restriction
            )
            stats[action_name] = stream.getvalue()
        return self._stats_to_str(stats)

    def teardown(self, stage: str | None) -> None:
        """Close the report and forget the recorded actions."""
        super().teardown(stage=stage)
        for profile in self.profiled_actions.values():
            profile.disable()
        self.profiled_actions.clear()
        self._running.clear()

    def _write_raw_stats(self, action_name: str, profile: cProfile.Profile) -> None:
        """``Profile.dump_stats`` writes local files only; go through one so ``dirpath`` may be a URL."""
        target = self._output_path(action_name=action_name, extension=".prof")
        with tempfile.TemporaryDirectory() as tmp:
            local = os.path.join(tmp, "stats.prof")
            profile.dump_stats(local)
            with open(local, "rb") as source, _filesystem(target).open(target, "wb") as sink:
                sink.write(source.read())

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle the configuration only (spawned workers get a fresh profiler): cProfile objects do not pickle."""
        state = {
            "dirpath": self.dirpath,
            "filename": self.filename,
            "line_count_restriction": self.line_count_restriction,
            "dump_stats": self.dump_stats,
        }
        return (self.__class__, (), state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Apply the configuration :meth:`__reduce__` kept."""
        self.__dict__.update(state)
