"""A 2-rank ddp job in which rank 1 stops taking part: it sleeps inside training step 2.

``python hang.py TIMEOUT_SECONDS``. Rank 0 then waits in the gradient all-reduce until the
strategy's timeout; the job must fail soon after, saying which rank did not arrive.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.strategies import DDPStrategy


class Stuck(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        if batch_idx == 2 and self.global_rank == 1:
            time.sleep(300)  # never arrives at the all-reduce
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    x = torch.randn(64, 4)
    trainer = Trainer(
        strategy=DDPStrategy(timeout=timedelta(seconds=float(sys.argv[1]))), accelerator="cpu", devices=2,
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
    )
    trainer.fit(Stuck(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=4))
