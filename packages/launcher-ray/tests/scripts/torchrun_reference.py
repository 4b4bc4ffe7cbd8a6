"""Plain PyTorch under torchrun, no phalanx and no Ray: DDP, FSDP2 and local SGD on the tests' data.

Usage: ``python -m torch.distributed.run --standalone --nproc-per-node 2 torchrun_reference.py OUT``.
Rank 0 writes OUT/torchrun_ddp.pt, OUT/torchrun_fsdp.pt and OUT/torchrun_local_sgd.pt: every
parameter, whole, after STEPS optimizer steps. The loop is what the Trainer does with these
settings: DistributedSampler without shuffling, zero_grad, forward, backward, step.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from ray_case import BATCH, LR, MOMENTUM, STEPS, SYNC_EVERY, full_state, make_dataset, make_layers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


def train(model: torch.nn.Module, after_step: Callable[[int, torch.optim.Optimizer], None] | None = None) -> None:
    """STEPS SGD steps over this rank's shard of the data, epoch after epoch."""
    data = make_dataset()
    sampler = DistributedSampler(data, shuffle=False, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    step, epoch = 0, 0
    while step < STEPS:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if step == STEPS:
                break
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            if after_step is not None:
                after_step(step, optimizer)
            step += 1
        epoch += 1


def local_sgd_sync(model: torch.nn.Module) -> Callable[[int, torch.optim.Optimizer], None]:
    """Every SYNC_EVERY steps, average the parameters and the momentum buffers over the ranks."""

    def sync(step: int, optimizer: torch.optim.Optimizer) -> None:
        if (step + 1) % SYNC_EVERY:
            return
        with torch.no_grad():
            buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
            for tensor in [*model.parameters(), *buffers]:
                dist.all_reduce(tensor)
                tensor.div_(dist.get_world_size())

    return sync


def main(out: str) -> None:
    dist.init_process_group("gloo")
    results = {}
    ddp = DistributedDataParallel(make_layers())
    train(ddp)
    results["ddp"] = full_state(ddp.module)
    sharded = fully_shard(make_layers(), mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    train(sharded)
    results["fsdp"] = full_state(sharded)
    local = make_layers()
    train(local, local_sgd_sync(local))
    results["local_sgd"] = full_state(local)
    if dist.get_rank() == 0:
        for name, state in results.items():
            torch.save(state, os.path.join(out, f"torchrun_{name}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    # torch 2.13's gloo can abort at interpreter shutdown in a process that made its own group (docs/ddp.md)
    sys.stdout.flush()
    os._exit(0)
