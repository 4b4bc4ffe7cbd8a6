"""A (2 x 2) run in which global rank 2 raises at its third batch; the job must stop fast.

``python fail.py OUT``: the surviving ranks would otherwise wait in a collective for the failed
one until the process-group timeout (30 minutes by default).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from train import Net

import phalanx
from phalanx_strategy_model_parallel import ModelParallelStrategy


class FailingNet(Net):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 2 and self.trainer.global_rank == 2:
            msg = "injected failure on rank 2"
            raise RuntimeError(msg)
        return super().training_step(batch, batch_idx)


if __name__ == "__main__":
    trainer = phalanx.Trainer(
        accelerator="cpu", devices=4, strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2),
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, default_root_dir=sys.argv[1],
    )
    trainer.fit(FailingNet())
