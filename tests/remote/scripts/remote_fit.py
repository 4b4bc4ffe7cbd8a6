"""Training script the remote tests run in a subprocess (ddp and deepspeed re-run it per rank).

Usage: ``python remote_fit.py MODE STRATEGY DEVICES ROOT EPOCHS OUT``.

``fit`` trains ``EPOCHS`` epochs with ``default_root_dir=ROOT`` (an ``s3://`` URL), checkpointing
every epoch (``last`` too) and logging to CSV there. ``resume`` does the same with
``ckpt_path="last"``. ``both`` runs ``fit`` for ``EPOCHS / 2`` epochs, then ``resume`` to ``EPOCHS``
with a new Trainer and a new model in the same processes (one launch instead of two; the resume
still finds and reads everything from the store). ``kill`` is ``fit`` whose save at epoch 2
carries a 112 MiB tensor, so its upload takes long enough for the test to ``kill -9`` the run in
the middle of it. Rank 0 writes ``OUT/result.pt`` (final weights, global step, the checkpoint
resumed from).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.callbacks import ModelCheckpoint

LR = 0.05
BATCH = 4
SAMPLES = 32


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True) * 0.3 + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(x, y)


def layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


class Net(Module):
    def __init__(self, *, big_save_at_epoch: int = -1) -> None:
        super().__init__()
        self.net = layers()
        self.big_save_at_epoch = big_save_at_epoch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return optimizer(self.parameters())

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if checkpoint["epoch"] == self.big_save_at_epoch:
            checkpoint["ballast"] = torch.ones(28 * 2**20)  # 112 MiB: s3fs uploads it in parts


def train(mode: str, strategy: str, devices: int, root: str, epochs: int, out: str) -> None:
    """One run of the script (see the module docstring for ``mode``)."""
    if mode == "both":
        train("fit", strategy, devices, root, epochs // 2, out)
        train("resume", strategy, devices, root, epochs, out)
        return
    trainer = Trainer(
        accelerator="cpu",
        strategy=strategy,
        devices=devices,
        max_epochs=epochs,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(save_last=True)],
    )
    model = Net(big_save_at_epoch=1 if mode == "kill" else -1)
    loader = DataLoader(dataset(), batch_size=BATCH)
    trainer.fit(model, loader, ckpt_path="last" if mode == "resume" else None)
    # fsdp leaves sharded parameters (DTensors) behind; its test reads the final checkpoint instead
    weights = {
        key: value.detach().cpu().clone() for key, value in model.state_dict().items() if type(value) is torch.Tensor
    }
    if trainer.is_global_zero:
        os.makedirs(out, exist_ok=True)
        result = {"weights": weights, "global_step": trainer.global_step, "ckpt_path": trainer.ckpt_path}
        torch.save(result, os.path.join(out, "result.pt"))


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
