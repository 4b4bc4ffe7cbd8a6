"""EarlyStopping, LearningRateMonitor and ModelCheckpoint with TensorBoard and CSV loggers.

Written against ``lightning.pytorch``; the tests run it unmodified under Lightning and renamed
under phalanx. A regression model learns for three epochs; from the fourth on, its validation
loss is pushed up on purpose, so ``EarlyStopping(patience=2)`` must stop after the fifth epoch on
every rank. The learning rate follows a StepLR schedule the monitor logs once per epoch. Global
rank 0 writes what the tests check (where the logs are, the stop, the best score) to ``--out``;
the tests read the logs back with TensorBoard's and the csv module's own readers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 8
SAMPLES = 64
LR = 0.1
#: From this epoch on, every validation loss is raised by PENALTY per epoch past it.
SPOIL_EPOCH = 3
PENALTY = 10.0
PATIENCE = 2
MAX_EPOCHS = 12


def regression_data(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    weights = torch.arange(1.0, FEATURES + 1).unsqueeze(1) / FEATURES
    return TensorDataset(x, x @ weights + 0.01 * torch.randn(SAMPLES, 1, generator=generator))


class Regression(LightningModule):
    def __init__(self, lr: float = LR) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(FEATURES, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        penalty = PENALTY * max(0, self.current_epoch - SPOIL_EPOCH + 1)
        self.log("val_loss", F.mse_loss(self.layer(x), y) + penalty, sync_dist=True)

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", default="1")
    parser.add_argument("--root", default=".", help="the Trainer's default_root_dir")
    parser.add_argument("--out", required=True, help="JSON file for the results (written by global rank 0)")
    return parser.parse_args()


def run() -> None:
    args = parse_args()
    torch.manual_seed(0)
    model = Regression()
    stopper = EarlyStopping(monitor="val_loss", mode="min", patience=PATIENCE)
    checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=2, filename="{epoch}-{val_loss:.3f}")
    loggers = [TensorBoardLogger(args.root, name="tb"), CSVLogger(args.root, name="csv")]
    trainer = Trainer(
        default_root_dir=args.root,
        accelerator=args.accelerator,
        strategy=args.strategy,
        devices=int(args.devices),
        max_epochs=MAX_EPOCHS,
        callbacks=[stopper, LearningRateMonitor(logging_interval="epoch"), checkpoint],
        logger=loggers,
        log_every_n_steps=2,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(regression_data(1), batch_size=8), DataLoader(regression_data(2), batch_size=8))
    if trainer.is_global_zero:
        result = {
            "world_size": trainer.world_size,
            "stopped_epoch": stopper.stopped_epoch,
            "current_epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "should_stop": trainer.should_stop,
            "best_score": float(checkpoint.best_model_score),
            "best_k": sorted(Path(p).name for p in checkpoint.best_k_models),
            "tensorboard_dir": loggers[0].log_dir,
            "csv_dir": loggers[1].log_dir,
        }
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    run()
