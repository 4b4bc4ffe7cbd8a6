"""A bug-report style script in Lightning's API: a random dataset, a one-layer model, fit and test.

Written against ``lightning.pytorch``; the tests run it unmodified under Lightning and, after the
rename rule of ``tests/lightning/rename.py``, under phalanx. The strategy, device count and
accelerator come from the command line so the same file runs on one CPU or as two gloo ranks.
Global rank 0 writes the numbers the tests check (losses, weights, every rank's batches, time) to
``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, Dataset

#: Features of each random sample and number of outputs of the model.
SIZE = 32
OUTPUTS = 2
LR = 0.1


class RandomDataset(Dataset):
    """``length`` samples of ``size`` random features, the same on every rank (seeded generator)."""

    def __init__(self, size: int, length: int, seed: int) -> None:
        self.len = length
        self.data = torch.randn(length, size, generator=torch.Generator().manual_seed(seed))

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class BoringModel(LightningModule):
    """One linear layer whose loss is the sum of its outputs: every step moves the weights."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(SIZE, OUTPUTS)
        self.seen: dict[str, torch.Tensor] = {}  # the last batch of each stage, for the tests' reference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen["train"] = batch.detach().clone()
        loss = self(batch).sum()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        loss = self(batch).sum()
        self.log("valid_loss", loss)

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.seen["test"] = batch.detach().clone()
        loss = self(batch).sum()
        # averaged over the ranks, so the value trainer.test returns is the same on every rank
        self.log("test_loss", loss, sync_dist=True)

    def on_test_end(self) -> None:
        # every rank's batches, (world, batch, SIZE), gathered while the stage's process group is up:
        # the tests replay the step on them in plain PyTorch
        self.gathered = {
            stage: self.all_gather(batch).reshape(-1, *batch.shape).tolist() for stage, batch in self.seen.items()
        }

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.layer.parameters(), lr=LR)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", default="1", help="a count, or 'auto'")
    parser.add_argument("--root", default=".", help="the Trainer's default_root_dir")
    parser.add_argument("--out", required=True, help="JSON file for the results (written by global rank 0)")
    return parser.parse_args()


def run() -> None:
    args = parse_args()
    start = time.perf_counter()
    train_data = DataLoader(RandomDataset(SIZE, 64, seed=1), batch_size=2)
    val_data = DataLoader(RandomDataset(SIZE, 64, seed=2), batch_size=2)
    test_data = DataLoader(RandomDataset(SIZE, 64, seed=3), batch_size=2)

    torch.manual_seed(0)  # the initial weights the tests' reference starts from
    model = BoringModel()
    devices = args.devices if args.devices == "auto" else int(args.devices)
    trainer = Trainer(
        default_root_dir=args.root,
        accelerator=args.accelerator,
        strategy=args.strategy,
        devices=devices,
        limit_train_batches=1,
        limit_val_batches=1,
        limit_test_batches=1,
        num_sanity_val_steps=0,
        max_epochs=1,
        enable_model_summary=False,
        enable_progress_bar=False,
        logger=False,
    )
    trainer.fit(model, train_dataloaders=train_data, val_dataloaders=val_data)
    fit_metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    tested = trainer.test(model, dataloaders=test_data, verbose=False)
    seen = model.gathered
    if trainer.is_global_zero:
        weights = {name: value.detach().cpu().tolist() for name, value in model.layer.state_dict().items()}
        result = {
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "train_loss": fit_metrics["train_loss"],
            "valid_loss": fit_metrics["valid_loss"],
            "test_loss": float(tested[0]["test_loss"]),
            "weights": weights,
            "train_batches": seen["train"],
            "test_batches": seen["test"],
            "checksum": float(sum(value.detach().double().sum() for value in model.layer.state_dict().values())),
            "seconds": time.perf_counter() - start,
        }
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    run()
