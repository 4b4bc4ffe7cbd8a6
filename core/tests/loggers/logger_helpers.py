"""A tiny Module that remembers every value it logs, and a plain-PyTorch run of the same fit.

The logger tests fit it with a real backend, read the files back with the backend's own reader
and compare what was written with what the Module computed (exactly: TensorBoard stores float32,
as the Module computes; MLflow and W&B store the float64 of that number). The plain loop checks
that the losses themselves are those of ordinary SGD, so a logger that wrote stale or shifted
values cannot match by accident.

Self-contained (no trainer_helpers import): the two-rank test runs a test file as a script, where
only this folder is on ``sys.path``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx.module import Module

__all__ = ["FEATURES", "Recorder", "data", "plain_losses", "trainer_kwargs"]

FEATURES = 3


def data(n: int = 16, seed: int = 0) -> TensorDataset:
    """A fixed regression set (its own generator, so the global seed does not matter)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=generator))


def trainer_kwargs(**overrides: Any) -> dict[str, Any]:
    """Quiet, CPU, log every step, no sanity check and no checkpoints unless asked."""
    base: dict[str, Any] = {
        "accelerator": "cpu",
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "log_every_n_steps": 1,
        "num_sanity_val_steps": 0,
        "max_epochs": 2,
    }
    base.update(overrides)
    return base


class Recorder(Module):
    """Linear regression that logs ``train_loss`` every step and ``val_loss`` per epoch, and records both.

    ``train_log`` holds ``(global_step, loss)`` per training step (the step the Trainer logs it at);
    ``val_log`` the validation loss of each epoch (one validation batch, so the epoch mean is the value).
    """

    def __init__(self, lr: float = 0.1, hidden: int = 4, sync_dist: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(FEATURES, 1)
        self.example_input_array = torch.zeros(2, FEATURES)
        self.train_log: list[tuple[int, float]] = []
        self.val_log: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=self.hparams.sync_dist)
        self.train_log.append((self.global_step, float(loss.detach())))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("val_loss", loss)
        self.val_log.append(float(loss))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def plain_losses(model: Recorder, initial: dict[str, torch.Tensor], loader: DataLoader, epochs: int) -> list[float]:
    """The training losses of a hand-written SGD loop from ``initial`` weights over ``loader``."""
    layer = nn.Linear(FEATURES, 1)
    layer.load_state_dict({key.removeprefix("layer."): value for key, value in initial.items()})
    optimizer = torch.optim.SGD(layer.parameters(), lr=model.hparams.lr)
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(layer(x), y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return losses
