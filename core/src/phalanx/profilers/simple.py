"""SimpleProfiler: wall-clock time of each action, reported as a table.

The cheapest real profiler: two ``perf_counter`` reads per action. It answers "where does the
time of a step go" (data loading, the step, the optimizer, a slow callback) without the overhead
of cProfile or the torch profiler, which is why it is the one to reach for first.
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from pathlib import Path

from phalanx.profilers.profiler import Profiler

__all__ = ["SimpleProfiler"]


class SimpleProfiler(Profiler):
    """Record the duration of every action; report mean, count, total and share of the run.

    Args:
        dirpath: Folder of the report file (see :class:`~phalanx.profilers.Profiler`).
        filename: Report file name without extension; without it the report is printed.
        extended: Also report the number of calls and each action's percentage of the time
            since the profiler was created (the "Total" row), sorted by that percentage. Without
            it, the table has mean and total only, sorted by mean.

    Raises:
        ValueError: An action is started while already running, or stopped without being started.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None, extended: bool = True) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.current_actions: dict[str, float] = {}
        #: Every duration (seconds) of every action, in the order they ended.
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.extended = extended
        self.start_time = time.perf_counter()

    def start(self, action_name: str) -> None:
        """Note when ``action_name`` began."""
        if action_name in self.current_actions:
            msg = f"Attempted to start {action_name!r}, which has already started: stop it before starting it again"
            raise ValueError(msg)
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        """Record the time since ``action_name`` started."""
        end = time.perf_counter()
        began = self.current_actions.pop(action_name, None)
        if began is None:
            msg = f"Attempting to stop recording an action ({action_name!r}) which was never started: call start first"
            raise ValueError(msg)
        self.recorded_durations[action_name].append(end - began)

    def summary(self) -> str:
        """The table: Lightning's layout, so reports compare side by side."""
        sep = os.linesep
        title = f"{self._stage.upper()} " if self._stage is not None else ""
        text = f"{title}Profiler Report{sep}"
        if not self.recorded_durations:
            return text
        width = max(len(k) for k in self.recorded_durations)

        def row(*cells: str) -> str:
            action, *numbers = cells
            return f"{sep}|  {action:<{width}s}\t|" + "".join(f"  {cell:<15}\t|" for cell in numbers)

        if self.extended:
            header = row("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
            rule = f"{sep}{'-' * len(header.expandtabs())}"
            total_run = time.perf_counter() - self.start_time
            stats = []
            for action, durations in self.recorded_durations.items():
                total = math.fsum(durations)
                stats.append((action, total / len(durations), len(durations), total, 100.0 * total / total_run))
            stats.sort(key=lambda s: s[4], reverse=True)
            calls = sum(s[2] for s in stats)
            text += rule + header + rule + row("Total", "-", f"{calls}", f"{total_run:.5}", "100 %") + rule
            for action, mean, count, total, share in stats:
                text += row(action, f"{mean:.5}", f"{count}", f"{total:.5}", f"{share:.5}")
        else:
            header = row("Action", "Mean duration (s)", "Total time (s)")
            rule = f"{sep}{'-' * len(header.expandtabs())}"
            text += rule + header + rule
            rows = [(a, math.fsum(d) / len(d), math.fsum(d)) for a, d in self.recorded_durations.items()]
            for action, mean, total in sorted(rows, key=lambda r: r[1], reverse=True):
                text += row(action, f"{mean:.5}", f"{total:.5}")
        return text + rule + sep
