"""The same training as torchrun_reference.py, through phalanx with LocalSGDStrategy.

Workers are forked (the cheapest start: torch is imported once); the conformance kit covers the
other start methods.

Usage: ``python phalanx_run.py OUT S...``; writes OUT/phalanx_local_sgd_<S>.pt (rank 0's weights).
"""

from __future__ import annotations

import os
import sys

import torch
from parity_model import BATCH, LR, MOMENTUM, STEPS, make_dataset, make_layers
from phalanx_local_sgd.strategy import LocalSGDStrategy
from torch.utils.data import DataLoader

from phalanx import Module, Trainer


class Net(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = make_layers()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layers(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(make_dataset(), batch_size=BATCH, shuffle=False)


if __name__ == "__main__":
    out = sys.argv[1]
    for sync_every in [int(s) for s in sys.argv[2:]]:
        model = Net()
        trainer = Trainer(
            strategy=LocalSGDStrategy(sync_every=sync_every, start_method="fork"), accelerator="cpu", devices=2, max_steps=STEPS,
            logger=False, enable_checkpointing=False, enable_progress_bar=False, default_root_dir=out,
        )
        trainer.fit(model)
        if trainer.is_global_zero:
            torch.save(model.layers.state_dict(), os.path.join(out, f"phalanx_local_sgd_{sync_every}.pt"))
