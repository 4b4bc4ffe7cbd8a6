"""``phalanx doctor``'s tiny fit: a few SGD steps of linear regression under one strategy.

Copied next to its output by ``phalanx doctor`` and run as a script, because a strategy may
re-execute the script once per rank (``ddp``) or spawn workers that import it (``ddp_spawn``:
hence the Module at module level). Usage::

    python doctor_fit.py STRATEGY ACCELERATOR RESULT.json

A parallel strategy runs with 2 processes, any other with 1. Rank 0 writes the first and last
loss to ``RESULT.json`` when training ends; the doctor checks the loss went down.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.registry import StrategyRegistry
from phalanx.strategies import ParallelStrategy


class Regression(Module):
    """y = x @ w: the loss must fall within a few steps under any correct strategy."""

    def __init__(self, result: Path) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.result = result
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.linear(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self) -> None:
        if self.global_rank == 0:
            world = self.trainer.world_size
            self.result.write_text(json.dumps({"first": self.losses[0], "last": self.losses[-1], "world_size": world}))


def main(strategy: str, accelerator: str, result: Path) -> None:
    """Fit :class:`Regression` for 12 steps under ``strategy`` (2 processes if it is parallel)."""
    torch.manual_seed(0)
    devices = 2 if issubclass(StrategyRegistry.get_class(strategy), ParallelStrategy) else 1
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    trainer = Trainer(
        accelerator=accelerator,
        strategy=strategy,
        devices=devices,
        max_steps=12,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=str(result.parent),
    )
    trainer.fit(Regression(result), DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
