"""Loggers with one real bug each; the logger kit must fail every one of them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from phalanx.loggers import CSVLogger


class EagerExperimentCSV(CSVLogger):
    """Opens its event stream in ``experiment`` on whichever rank asks: every rank writes a file."""

    _stream: Any = None

    @property
    def experiment(self) -> Any:
        if self._stream is None:
            os.makedirs(self.log_dir, exist_ok=True)
            self._stream = open(os.path.join(self.log_dir, f"events-{os.getpid()}.txt"), "a")  # noqa: SIM115
        return super().experiment  # the CSV writer, so the logger still logs: the extra file is the bug


class OwnStepCSV(CSVLogger):
    """Numbers rows with its own counter instead of ``step``: a resumed run starts again at 0."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._own_step = 0

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        super().log_metrics(metrics, self._own_step)
        self._own_step += 1


class UnflushedCSV(CSVLogger):
    """Buffers rows and never flushes them at the end: whatever the last flush missed is lost."""

    def finalize(self, status: str) -> None:
        del status
