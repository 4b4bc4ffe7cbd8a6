"""ModelCheckpoint and AsyncCheckpointIO on 2 ranks, forked from this one process.

Usage: python checkpoint_ranks.py OUT_DIR
``topk``: each rank logs its own value of ``score`` (no sync_dist), so the ranks would rank the
epochs differently; ModelCheckpoint(monitor="score", save_top_k=2) must still keep one top-k on
every rank. ``async``: AsyncCheckpointIO saves every 2 steps from rank 0 while training goes on.
Every checkpoint IO call is recorded per rank; each rank writes OUT_DIR/<scenario>.rank<r>.json.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from common import PhalanxNet, loader, state_to_lists, trainer_kwargs, write_json

import phalanx
from phalanx.callbacks import ModelCheckpoint
from phalanx.checkpoint_io import AsyncCheckpointIO, TorchCheckpointIO
from phalanx.strategies import DDPStrategy

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
#: Per-epoch score each rank logs. Rank 0 alone ranks epochs 1 and 3 best, rank 1 alone 3 and 0.
SCORES = {0: [3.0, 1.0, 4.0, 2.0], 1: [2.0, 3.0, 5.0, 1.0]}
CALLS: list[tuple[str, str]] = []


class RecordingIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        CALLS.append(("save", os.path.basename(path)))
        super().save_checkpoint(checkpoint, path, storage_options=storage_options)

    def remove_checkpoint(self, path: Any) -> None:
        CALLS.append(("remove", os.path.basename(path)))
        super().remove_checkpoint(path)


class Scored(PhalanxNet):
    scenario = "topk"

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        value = SCORES[self.trainer.global_rank][self.trainer.current_epoch]
        self.log("score", torch.tensor(value))  # deliberately not synced: it differs per rank

    def on_train_start(self) -> None:
        self._initial = state_to_lists(self.state_dict())  # after DDP's broadcast from rank 0

    def on_train_end(self) -> None:
        callback = next(c for c in self.trainer.callbacks if isinstance(c, ModelCheckpoint))
        write_json(
            str(OUT / f"{self.scenario}.rank{self.trainer.global_rank}.json"),
            {
                "best_k": {os.path.basename(k): float(v) for k, v in callback.best_k_models.items()},
                "best": os.path.basename(callback.best_model_path),
                "calls": CALLS,
                "initial": self._initial,
                "final": state_to_lists(self.state_dict()),
            },
        )


class Streamed(Scored):
    scenario = "async"

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass


def fit(module: PhalanxNet, callback: ModelCheckpoint, io: Any, epochs: int, val: bool) -> None:
    strategy = DDPStrategy(start_method="fork", timeout=timedelta(seconds=60), checkpoint_io=io)
    kwargs = trainer_kwargs(devices=2, strategy=strategy, max_epochs=epochs, enable_checkpointing=True)
    trainer = phalanx.Trainer(**kwargs, callbacks=[callback], limit_val_batches=1 if val else 0)
    trainer.fit(module, loader(), loader() if val else None)


if __name__ == "__main__":
    torch.manual_seed(0)
    topk = ModelCheckpoint(dirpath=str(OUT / "topk"), filename="{epoch}", monitor="score", mode="min", save_top_k=2)
    fit(Scored(), topk, RecordingIO(), epochs=4, val=True)
    CALLS.clear()
    streamed = ModelCheckpoint(dirpath=str(OUT / "async"), filename="{step}", every_n_train_steps=2, save_top_k=-1)
    fit(Streamed(), streamed, AsyncCheckpointIO(RecordingIO()), epochs=1, val=False)
