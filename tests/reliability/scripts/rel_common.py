"""Model, data and the plain-PyTorch reference shared by the reliability scripts and tests.

The reference is computed in the test process: two ranks with ``DistributedSampler(seed=0)``
averaging gradients is the same as one process stepping on the union of both ranks' batches
(equal batch sizes), so a plain single-process loop over those global batches gives the weights
every strategy must end with.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import phalanx

WORLD = 2
BATCH = 4
LR = 0.1
TRAIN_SAMPLES = 48  # 6 optimizer steps per epoch with 2 ranks x 4


def build_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def dataset(samples: int = TRAIN_SAMPLES, seed: int = 1234) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 8, generator=generator)
    y = (x.sum(dim=1, keepdim=True) * 0.3).tanh() + 0.1 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(x, y)


def train_loader() -> DataLoader:
    return DataLoader(dataset(), batch_size=BATCH, shuffle=True)


def eval_loader(seed: int) -> DataLoader:
    return DataLoader(dataset(16, seed), batch_size=BATCH, shuffle=False)


class Net(phalanx.Module):
    """A small regression MLP with every step the Trainer can run."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = build_layers()
        self.pause_at: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x).float(), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x).float(), y), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x).float(), y), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        x, _ = batch
        return torch.cat([x, self(x).float()], dim=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


def reference_weights(steps: int, epochs: int = 1) -> dict[str, torch.Tensor]:
    """Plain torch: SGD on the union of the two ranks' batches, ``steps`` optimizer steps."""
    net = build_layers()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    data = dataset()
    done = 0
    for epoch in range(epochs):
        shards = []
        for rank in range(WORLD):
            sampler = DistributedSampler(data, num_replicas=WORLD, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            shards.append(list(sampler))
        for step in range(len(shards[0]) // BATCH):
            if done == steps:
                break
            optimizer.zero_grad()
            losses = []
            for shard in shards:
                index = shard[step * BATCH : (step + 1) * BATCH]
                x, y = data.tensors[0][index], data.tensors[1][index]
                losses.append(nn.functional.mse_loss(net(x), y))
            (sum(losses) / WORLD).backward()
            optimizer.step()
            done += 1
    return {f"layers.{k}": v.detach().clone() for k, v in net.state_dict().items()}


def reference_loss(weights: dict[str, torch.Tensor], seed: int) -> float:
    net = build_layers()
    net.load_state_dict({k.removeprefix("layers."): v for k, v in weights.items()})
    x, y = dataset(16, seed).tensors
    with torch.no_grad():
        return float(nn.functional.mse_loss(net(x), y))


def reference_predictions(weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    net = build_layers()
    net.load_state_dict({k.removeprefix("layers."): v for k, v in weights.items()})
    with torch.no_grad():
        return net(x)


def trainer_kwargs(strategy: str, root: str, **overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": WORLD,
        "strategy": strategy,
        "max_epochs": 1,
        "enable_progress_bar": False,
        "logger": False,
        "enable_checkpointing": False,
        "default_root_dir": root,
    }
    kwargs.update(overrides)
    return kwargs


def write_json(path: str, payload: Any) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # each writer its own: two ranks may write the same file
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle)
    os.replace(tmp, path)


def to_lists(state: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Plain lists of every tensor; FSDP's DTensor shards are gathered first (collective)."""
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}
    return {k: v.detach().float().flatten().tolist() for k, v in full.items()}
