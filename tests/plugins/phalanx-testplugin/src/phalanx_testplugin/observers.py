"""A callback and a logger from outside the core, resolved by name like the built-in ones.

Both write JSON lines a test reads back: the callback records what it saw at each training batch
end through the public TrainerView, the logger records every ``log_metrics`` call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from phalanx.callbacks import Callback
from phalanx.loggers import Logger


class StepJournal(Callback):
    """Appends ``{"step", "epoch", "rank"}`` per training batch to ``<default_root_dir>/journal-<rank>.jsonl``."""

    def __init__(self, filename: str = "journal") -> None:
        self.filename = filename

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        path = os.path.join(trainer.default_root_dir, f"{self.filename}-{trainer.global_rank}.jsonl")
        with open(path, "a") as fh:
            fh.write(
                json.dumps({"step": trainer.global_step, "epoch": trainer.current_epoch, "rank": trainer.global_rank})
                + "\n"
            )


class JSONLinesLogger(Logger):
    """Writes each ``log_metrics`` call as one JSON line in ``<save_dir>/metrics.jsonl``."""

    def __init__(self, save_dir: str = ".") -> None:
        self._save_dir = save_dir

    @property
    def name(self) -> str:
        return "jsonl"

    @property
    def version(self) -> int:
        return 0

    @property
    def save_dir(self) -> str:
        return self._save_dir

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        os.makedirs(self._save_dir, exist_ok=True)
        with open(os.path.join(self._save_dir, "metrics.jsonl"), "a") as fh:
            fh.write(json.dumps({"step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")
