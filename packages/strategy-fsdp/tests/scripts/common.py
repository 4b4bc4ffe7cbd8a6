"""Model, data and hyper-parameters shared by the FSDP runs and the plain-torch DDP reference.

Both sides import this file, so they train the same network from the same initial weights on the
same per-rank batches; any difference in losses or weights comes from the strategy.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import phalanx

IN_FEATURES, HIDDEN = 8, 16
SAMPLES, BATCH_SIZE, ACCUMULATE, CLIP, LR, EPOCHS = 48, 4, 2, 0.5, 0.05, 2

#: Block forward calls in this process (activation checkpointing re-runs them in backward).
FORWARD_CALLS = {"Block": 0}


class Block(nn.Module):
    """Linear + tanh: the unit that is sharded (and optionally recomputed) on its own."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        FORWARD_CALLS["Block"] += 1
        return torch.tanh(self.linear(x))


def make_net() -> nn.Sequential:
    """The network, with weights fixed by seed so every run starts identically."""
    torch.manual_seed(0)
    return nn.Sequential(Block(IN_FEATURES, HIDDEN), Block(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 1))


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(123)
    x = torch.randn(SAMPLES, IN_FEATURES, generator=generator)
    y = torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(x, y)


class Net(phalanx.Module):
    """The phalanx side: the same network and optimizer, per-batch losses recorded."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.net = make_net() if hidden == HIDDEN else nn.Sequential(Block(IN_FEATURES, hidden), nn.Linear(hidden, 1))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.parameters())

    def train_dataloader(self) -> DataLoader:
        return DataLoader(dataset(), batch_size=BATCH_SIZE, shuffle=False)


def write_json(path: str, value: Any) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # each writer its own: two ranks may write the same file
    with open(tmp, "w") as handle:
        json.dump(value, handle)
    os.replace(tmp, path)
