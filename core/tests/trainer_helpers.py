"""Small models, data and a plain-PyTorch reference loop shared by the Trainer tests.

The reference loop is what a user would write by hand; tests compare the Trainer's losses and
weights against it with ``torch.equal``, so any deviation in step order, scaling or data order fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx.callbacks.callback import Callback
from phalanx.module import Module

__all__ = ["LossRecorder", "Net", "dataset", "loader", "plain_fit", "quiet", "run_python"]


def dataset(n: int = 40, features: int = 6, seed: int = 0) -> TensorDataset:
    """A fixed regression dataset (independent of the global RNG)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = x @ torch.randn(features, 1, generator=generator) + 0.1 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def loader(n: int = 40, batch_size: int = 4, *, shuffle: bool = False, seed: int = 0, **kwargs: Any) -> DataLoader:
    """A DataLoader over :func:`dataset`."""
    return DataLoader(dataset(n, seed=seed), batch_size=batch_size, shuffle=shuffle, **kwargs)


def quiet(**overrides: Any) -> dict[str, Any]:
    """Trainer kwargs for tests: no bar, no logger, no checkpoints unless asked."""
    base: dict[str, Any] = {"enable_progress_bar": False, "logger": False, "enable_checkpointing": False}
    base.update(overrides)
    return base


class Net(Module):
    """A small MLP with dropout, so data order and RNG state both affect the result.

    Args:
        lr: Learning rate.
        optimizer: ``"sgd"`` or ``"adam"``.
        scheduler: Optional factory ``(optimizer) -> configure_optimizers dict entry``.
        dropout: Dropout probability.
    """

    def __init__(
        self,
        *,
        lr: float = 0.05,
        optimizer: str = "sgd",
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 1))
        self.lr = lr
        self.optimizer_name = optimizer
        self.scheduler = scheduler

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0])

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        if self.optimizer_name == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9)

    def configure_optimizers(self) -> Any:
        optimizer = self.make_optimizer(self.parameters())
        if self.scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.scheduler(optimizer)}


class LossRecorder(Callback):
    """Records the (undivided) training loss of every batch and the LR after each batch."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.lrs: list[float] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(outputs["loss"].clone())
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def plain_fit(
    model: Net,
    data: DataLoader,
    *,
    epochs: int = 1,
    max_steps: int = -1,
    accumulate: int = 1,
    clip: tuple[float, str] | None = None,
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
) -> tuple[list[torch.Tensor], list[float]]:
    """The hand-written loop the Trainer must reproduce exactly; returns (losses, lrs)."""
    optimizer = model.make_optimizer(model.parameters())
    config = scheduler(optimizer) if scheduler is not None else None
    sched = config["scheduler"] if isinstance(config, dict) else config
    interval = config.get("interval", "epoch") if isinstance(config, dict) else "epoch"
    frequency = config.get("frequency", 1) if isinstance(config, dict) else 1
    losses: list[torch.Tensor] = []
    lrs: list[float] = []
    steps = 0
    model.train()
    for epoch in range(epochs):
        batches = len(data)
        for batch_idx, (x, y) in enumerate(data):
            if max_steps != -1 and steps >= max_steps:
                return losses, lrs
            loss = nn.functional.mse_loss(model(x), y)
            if batch_idx % accumulate == 0:
                optimizer.zero_grad()
            (loss / accumulate if accumulate > 1 else loss).backward()
            if (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == batches:
                if clip is not None:
                    value, algorithm = clip
                    if algorithm == "norm":
                        nn.utils.clip_grad_norm_(model.parameters(), value)
                    else:
                        nn.utils.clip_grad_value_(model.parameters(), value)
                optimizer.step()
                steps += 1
                if sched is not None and interval == "step" and steps % frequency == 0:
                    sched.step()
            losses.append(loss.detach().clone())
            lrs.append(optimizer.param_groups[0]["lr"])
        if sched is not None and interval == "epoch" and (epoch + 1) % frequency == 0:
            sched.step()
    return losses, lrs


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter without the launcher's rank variables; fails on a non-zero exit."""
    from phalanx.utilities import rank_zero

    base = {k: v for k, v in os.environ.items() if k not in rank_zero.RANK_ENV_VARS}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
