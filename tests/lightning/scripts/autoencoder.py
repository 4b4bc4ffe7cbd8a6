"""An autoencoder with a LightningDataModule, a best-checkpoint callback and a reload, in Lightning's API.

The data module writes a small synthetic data set to disk in ``prepare_data`` (once per machine)
and reads it back in ``setup`` (on every rank), so nothing is downloaded. Training keeps the
checkpoint with the lowest ``val_loss``; testing then runs from that checkpoint
(``ckpt_path="best"``), and ``load_from_checkpoint`` must give back the hyperparameters and the
weights that produced the best score. The last epoch is spoilt on purpose (see
``configure_optimizers``) so that "best" and "last" differ. Global rank 0 writes the results to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 16
SAMPLES = {"fit": 128, "validate": 64, "test": 64, "predict": 32}


@rank_zero_only
def report(message: str) -> None:
    print(f"[autoencoder] {message}", flush=True)


class SyntheticDataModule(L.LightningDataModule):
    """Points near a 3-dimensional subspace of R^16: an autoencoder with a small code can learn it."""

    def __init__(self, data_dir: str, batch_size: int = 16) -> None:
        super().__init__()
        self.data_dir = Path(data_dir)
        self.batch_size = batch_size
        self.splits: dict[str, TensorDataset] = {}

    def prepare_data(self) -> None:
        path = self.data_dir / "synthetic.pt"
        if path.exists():
            return
        generator = torch.Generator().manual_seed(1234)
        basis = torch.randn(3, FEATURES, generator=generator)
        splits = {}
        for name, count in SAMPLES.items():
            codes = torch.randn(count, 3, generator=generator)
            splits[name] = codes @ basis + 0.05 * torch.randn(count, FEATURES, generator=generator)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        torch.save(splits, path)

    def setup(self, stage: str) -> None:
        splits = torch.load(self.data_dir / "synthetic.pt")
        wanted = ["fit", "validate"] if stage == "fit" else [stage]
        for name in wanted:
            self.splits[name] = TensorDataset(splits[name])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["fit"], batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["validate"], batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["test"], batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.splits["predict"], batch_size=self.batch_size)


class Autoencoder(L.LightningModule):
    def __init__(self, code_size: int = 3, hidden: int = 32, lr: float = 1e-2, spoil_epoch: int = -1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, code_size))
        self.decoder = nn.Sequential(nn.Linear(code_size, hidden), nn.ReLU(), nn.Linear(hidden, FEATURES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))

    def _loss(self, batch: list[torch.Tensor]) -> torch.Tensor:
        (x,) = batch
        return F.mse_loss(self(x), x)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("test_loss", self._loss(batch), sync_dist=True)

    def predict_step(self, batch: list[torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self.encoder(batch[0])

    def configure_optimizers(self) -> dict[str, object]:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        # the last epoch's learning rate is far too high on purpose: it makes that epoch worse, so
        # the best checkpoint is an earlier one and ckpt_path="best" differs from the last weights
        last = self.hparams.spoil_epoch
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 50.0 if epoch == last else 1.0)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class ValHistory(Callback):
    """``val_loss`` after each validation run, as ModelCheckpoint sees it."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if "val_loss" in trainer.callback_metrics:
            self.values.append(float(trainer.callback_metrics["val_loss"]))


def plain_loss(model: nn.Module, data: torch.Tensor) -> float:
    """Mean squared error of ``model`` over all of ``data`` in one pass, without the Trainer."""
    with torch.no_grad():
        return float(F.mse_loss(model(data), data))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", default="1", help="a count, or 'auto'")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--root", default=".", help="the Trainer's default_root_dir (data and checkpoints too)")
    parser.add_argument("--out", required=True, help="JSON file for the results (written by global rank 0)")
    return parser.parse_args()


def run() -> None:
    args = parse_args()
    start = time.perf_counter()
    L.seed_everything(42)
    root = Path(args.root)
    dm = SyntheticDataModule(str(root / "data"))
    model = Autoencoder(code_size=3, hidden=32, lr=1e-2, spoil_epoch=args.epochs - 1)
    history = ValHistory()
    checkpoint = ModelCheckpoint(dirpath=root / "checkpoints", monitor="val_loss", mode="min", save_top_k=1)
    trainer = L.Trainer(
        default_root_dir=args.root,
        accelerator=args.accelerator,
        strategy=args.strategy,
        devices=args.devices if args.devices == "auto" else int(args.devices),
        max_epochs=args.epochs,
        callbacks=[checkpoint, history],
        num_sanity_val_steps=0,
        enable_model_summary=False,
        enable_progress_bar=False,
        logger=False,
    )
    trainer.fit(model, datamodule=dm)
    train_loss = float(trainer.callback_metrics["train_loss"])
    last_test = trainer.test(model, datamodule=dm, verbose=False)  # the weights as training left them
    tested = trainer.test(ckpt_path="best", datamodule=dm, verbose=False)
    predicted = trainer.predict(model, datamodule=dm)
    best_path = trainer.checkpoint_callback.best_model_path
    best_score = float(trainer.checkpoint_callback.best_model_score)
    report(f"best checkpoint {best_path} (val_loss {best_score:.5f}), test {tested}")

    if trainer.is_global_zero:
        loaded = Autoencoder.load_from_checkpoint(best_path, map_location="cpu")
        loaded.eval()
        splits = torch.load(root / "data" / "synthetic.pt")
        weights = [value.detach().double() for value in loaded.state_dict().values()]
        result = {
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "train_loss": train_loss,
            "val_history": history.values,
            "best_score": best_score,
            "best_path": str(best_path),
            "test_loss": float(tested[0]["test_loss"]),
            "last_test_loss": float(last_test[0]["test_loss"]),
            "predicted_rows": sum(len(batch) for batch in predicted),
            "predicted_width": int(predicted[0].shape[-1]),
            "hparams": dict(loaded.hparams),
            "loaded_val_loss": plain_loss(loaded, splits["validate"]),
            "loaded_test_loss": plain_loss(loaded, splits["test"]),
            "checksum": float(sum(value.sum() for value in weights)),
            "seconds": time.perf_counter() - start,
        }
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    run()
