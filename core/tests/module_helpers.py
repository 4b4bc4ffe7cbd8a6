"""The small model and weight check shared by the Module surface tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from phalanx.module import Module


class Regressor(Module):
    """A small model whose layer sizes come from its hyperparameters."""

    def __init__(self, hidden: int, lr: float = 0.05, *, activation: str = "tanh") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def assert_same_weights(loaded: nn.Module, reference: dict[str, torch.Tensor]) -> None:
    state = loaded.state_dict()
    assert list(state) == list(reference)
    for key, value in reference.items():
        assert torch.equal(state[key], value), key
