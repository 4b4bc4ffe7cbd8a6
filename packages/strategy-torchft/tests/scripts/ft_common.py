"""Shared pieces of the torchft test scripts and tests: one model, one dataset, the replay reference.

The phalanx run and the plain-PyTorch reference see the same initial weights, the same shards
(DistributedSampler over all ranks of all groups) and the same optimizer, so the reference can
replay exactly the steps that committed, with the groups that took part in each.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SEED = 0
BATCH_SIZE = 4
LR = 0.05
SAMPLES = 48


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = (x @ torch.randn(8, 1, generator=g)).tanh() + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(x, y)


def build_layers() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def loss_fn(net: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(net(x), y)


def write_json(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # each writer its own: two ranks may write the same file
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


def shard_batch(world: int, rank: int, epoch: int, batch_idx: int) -> Any:
    """Batch ``batch_idx`` of epoch ``epoch`` of rank ``rank`` of ``world`` (what DDP's sampler gives)."""
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset(), num_replicas=world, rank=rank, shuffle=True, seed=0
    )
    sampler.set_epoch(epoch)
    loader = DataLoader(dataset(), batch_size=BATCH_SIZE, sampler=sampler)
    for index, batch in enumerate(loader):
        if index == batch_idx:
            return batch
    msg = f"no batch {batch_idx} in epoch {epoch} for rank {rank}/{world}"
    raise IndexError(msg)


def replay(
    steps: Sequence[tuple[int, int, Sequence[int]]], world: int, *, accumulate: int = 1, clip: float | None = None
) -> dict[str, torch.Tensor]:
    """Plain PyTorch: for each (epoch, last batch_idx, ranks) apply one Adam step on the mean over
    ``ranks`` of each rank's gradient, accumulated over the ``accumulate`` batches ending at
    ``batch_idx`` (each loss divided by ``accumulate``), clipped to norm ``clip``. With every rank
    in every step this is plain DDP over ``world`` ranks."""
    torch.manual_seed(SEED)
    net = nn.Sequential()
    net.add_module("net", build_layers())
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    for epoch, batch_idx, ranks in steps:
        grads: list[list[torch.Tensor]] = []
        for rank in ranks:
            net.zero_grad()
            for micro in range(batch_idx - accumulate + 1, batch_idx + 1):
                (loss_fn(net.net, shard_batch(world, rank, epoch, micro)) / accumulate).backward()
            grads.append([p.grad.detach().clone() for p in net.parameters()])  # type: ignore[union-attr]
        for index, param in enumerate(net.parameters()):
            total = grads[0][index].clone()
            for other in grads[1:]:
                total += other[index]
            param.grad = total / len(ranks)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        optimizer.step()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}
