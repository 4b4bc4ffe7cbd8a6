"""A vendor-style strategy that overrides only ``wrap_model`` (torch's own DistributedDataParallel).

Run as ``python wrap_only.py START_METHOD OUT_DIR``: trains 2 processes on CPU and writes the final
weights (rank 0) and each rank's world/rank to ``OUT_DIR``. ParallelStrategy must do everything
else: launch with the start method, join the process group, shard the data.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.strategies import ParallelStrategy


class WrapOnly(ParallelStrategy):
    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        return DistributedDataParallel(model) if training else super().wrap_model(model, training=training)


class Regression(Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_fit_start(self) -> None:
        out = os.environ["WRAP_ONLY_OUT"]
        with open(os.path.join(out, f"rank{self.global_rank}.json"), "w") as fh:
            json.dump({"world": self.trainer.world_size, "wrapped": type(self.trainer.strategy.model).__name__}, fh)


def data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def main() -> None:
    start_method, out = sys.argv[1], sys.argv[2]
    os.environ["WRAP_ONLY_OUT"] = out
    model = Regression()
    trainer = Trainer(
        strategy=WrapOnly(start_method=start_method), accelerator="cpu", devices=2, max_epochs=2,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
    )
    trainer.fit(model, DataLoader(data(), batch_size=4))
    if trainer.is_global_zero:
        torch.save(model.state_dict(), os.path.join(out, "weights.pt"))


if __name__ == "__main__":
    main()
