"""The demo-like model, its data and a plain-PyTorch reference run, shared by the XLA tests.

The reference is the loop a user would write by hand on the CPU; every XLA strategy must
reproduce its per-step losses, which proves the strategy trains the same model the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module

__all__ = ["BATCH", "EPOCHS", "DemoModel", "cpu_reference_losses", "make_loader"]

BATCH = 16
EPOCHS = 2


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))


class DemoModel(Module):
    """A small classifier; records each step's loss and, optionally, what the step saw."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = _net()
        self.lr = lr
        self.step_losses: list[torch.Tensor] = []
        self.seen: dict[str, Any] = {}

    @property
    def losses(self) -> list[float]:
        """Per-step losses as floats (fetched from the device once, after training)."""
        return [float(loss.cpu()) for loss in self.step_losses]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.step_losses.append(loss.detach())  # read after fit: no extra graph cut mid-step
        if not self.seen:
            self.seen = {"x_device": str(x.device), "param_dtype": str(next(self.parameters()).dtype)}
            inspect = getattr(self, "inspect_step", None)
            if callable(inspect):
                self.seen.update(inspect(x))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    y = (x[:, :4].argmax(dim=1)).long()
    return TensorDataset(x, y)


def make_loader() -> DataLoader:
    """64 samples in batches of 16, no shuffling: four steps per epoch, the same order every run."""
    return DataLoader(_data(), batch_size=BATCH)


def cpu_reference_losses(lr: float = 0.05, epochs: int = EPOCHS) -> list[float]:
    """The hand-written CPU loop: same init, data order and optimizer as :class:`DemoModel`."""
    torch.manual_seed(1)
    net = _net()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    losses = []
    for _ in range(epochs):
        for x, y in make_loader():
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return losses
