"""Shared pieces of the test scripts: one model, one dataset, one plain-PyTorch DDP loop.

The phalanx runs and the plain loop must see exactly the same initial weights, batches and
optimizer, so that their final weights can be compared bit for bit.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import phalanx

SEED = 0
EPOCHS = 2
BATCH_SIZE = 4
LR = 0.05


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(48, 8, generator=g)
    y = (x @ torch.randn(8, 1, generator=g)).tanh() + 0.1 * torch.randn(48, 1, generator=g)
    return TensorDataset(x, y)


def build_layers() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def loss_fn(net: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(net(x), y)


class Net(nn.Module):
    """The plain PyTorch model of the reference loop."""

    def __init__(self) -> None:
        super().__init__()
        self.net = build_layers()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class PhalanxNet(phalanx.Module):
    """The same model as a phalanx Module (same parameter names, same init order)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = build_layers()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = loss_fn(self, batch)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", loss_fn(self, batch), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=LR)


def loader() -> DataLoader:
    return DataLoader(dataset(), batch_size=BATCH_SIZE, shuffle=True)


def plain_ddp_loop(*, destroy: bool = True) -> dict[str, torch.Tensor]:
    """What a user writes by hand under torchrun: DDP + DistributedSampler(seed=0) + set_epoch.

    ``destroy=False`` keeps the process group, for a Trainer that must reuse it.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    torch.manual_seed(SEED)
    model = DistributedDataParallel(Net())
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    sampler: DistributedSampler[Any] = DistributedSampler(dataset(), shuffle=True, seed=0)
    data = DataLoader(dataset(), batch_size=BATCH_SIZE, sampler=sampler)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for batch in data:
            optimizer.zero_grad()
            loss_fn(model, batch).backward()
            optimizer.step()
    state = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    if destroy:
        dist.destroy_process_group()
    return state


def trainer_kwargs(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "max_epochs": EPOCHS,
        "enable_progress_bar": False,
        "logger": False,
        "enable_checkpointing": False,
    }
    kwargs.update(overrides)
    return kwargs


def write_json(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # each writer its own: two ranks may write the same file
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


def state_to_lists(state: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    return {k: v.flatten().tolist() for k, v in state.items()}
