"""sync_batchnorm=True on CUDA GPUs: BatchNorm layers become SyncBatchNorm and see every rank's batch.

Usage: python syncbn_gpu.py OUT_DIR DEVICES
One training step (SGD with lr=0, so only the BatchNorm statistics move) on ``DEVICES`` GPUs with
nccl; each rank writes OUT_DIR/rank<r>.json with the layer types and the running statistics.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from common import BATCH_SIZE, PhalanxNet, dataset, trainer_kwargs, write_json
from torch import nn
from torch.utils.data import DataLoader

import phalanx


class WithBatchNorm(PhalanxNet):
    def __init__(self) -> None:
        super().__init__()
        self.net.insert(1, nn.BatchNorm1d(16, momentum=1.0))  # running stats = the last batch's stats

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def on_train_end(self) -> None:
        norm = self.net[1]
        write_json(
            os.path.join(OUT, f"rank{self.trainer.global_rank}.json"),
            {
                "type": type(norm).__name__,
                "backend": str(torch.distributed.get_backend()),
                "running_mean": norm.running_mean.cpu().tolist(),
                "running_var": norm.running_var.cpu().tolist(),
            },
        )


if __name__ == "__main__":
    OUT, devices = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    data: Any = DataLoader(dataset(), batch_size=BATCH_SIZE, shuffle=False)
    trainer = phalanx.Trainer(
        **trainer_kwargs(accelerator="cuda", devices=devices, strategy="ddp", sync_batchnorm=True, max_steps=1)
    )
    trainer.fit(WithBatchNorm(), data)
