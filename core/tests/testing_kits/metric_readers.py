"""Reading back what the csv and tensorboard loggers wrote: the files, not the logger objects."""

from __future__ import annotations

import csv
from pathlib import Path

__all__ = ["read_csv_metrics", "read_tensorboard_metrics"]


def read_csv_metrics(save_dir: Path) -> dict[str, dict[int, float]]:
    """Every ``metrics.csv`` under ``save_dir``: metric -> {step: value} (empty cells skipped)."""
    metrics: dict[str, dict[int, float]] = {}
    for path in sorted(save_dir.rglob("metrics.csv")):
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                step = int(row["step"])
                for key, value in row.items():
                    if key not in ("step", "epoch") and value not in ("", None):
                        metrics.setdefault(key, {})[step] = float(value)
    return metrics


def read_tensorboard_metrics(save_dir: Path) -> dict[str, dict[int, float]]:
    """Every event file under ``save_dir``, read with tensorboard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics: dict[str, dict[int, float]] = {}
    for path in sorted(save_dir.rglob("events.out.tfevents.*")):
        events = EventAccumulator(str(path))
        events.Reload()
        for tag in events.Tags().get("scalars", []):
            for event in events.Scalars(tag):
                metrics.setdefault(tag, {})[event.step] = event.value
    return metrics
