"""Callbacks with one real bug each; the callback kit must fail every one of them."""

from __future__ import annotations

import os
from typing import Any

from phalanx.callbacks import Callback


class StepCounter(Callback):
    """Counts the training batches it has seen; its count is its checkpointed state."""

    def __init__(self) -> None:
        self.seen = 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen += 1

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seen = state_dict["seen"]


class ForgetfulCounter(StepCounter):
    """Saves its count but starts from 0 again after a resume."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        del state_dict


class EveryRankReport(StepCounter):
    """Writes its report at the end of training on every rank (no rank-zero guard)."""

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        os.makedirs(trainer.default_root_dir, exist_ok=True)
        with open(os.path.join(trainer.default_root_dir, f"report-rank{trainer.global_rank}.txt"), "w") as handle:
            handle.write(f"{self.seen}\n")


class RankZeroSetup(StepCounter):
    """Opens its summary on rank 0 only, then uses it on every rank: the other ranks crash."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            self.summary: list[int] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.summary.append(self.seen)
