"""Plain PyTorch under torchrun, no phalanx: DDP, then local SGD with every SYNC_EVERY given.

Usage: ``python -m torch.distributed.run --standalone --nproc-per-node 2 torchrun_reference.py OUT S...``
Rank 0 writes OUT/torchrun_ddp.pt and OUT/torchrun_local_sgd_<S>.pt (its replica's state dict after STEPS steps).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from parity_model import BATCH, LR, MOMENTUM, STEPS, make_dataset, make_layers
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


def train(model: torch.nn.Module, sync_every: int | None) -> None:
    """STEPS SGD steps on this rank's shard; every ``sync_every`` steps average the parameters and
    the momentum buffers (what LocalSGDStrategy does)."""
    loader = DataLoader(make_dataset(), batch_size=BATCH, sampler=DistributedSampler(make_dataset(), shuffle=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step, (x, y) in enumerate(loader):
        if step == STEPS:
            break
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if sync_every is not None and (step + 1) % sync_every == 0:
            with torch.no_grad():
                buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
                for tensor in [*model.parameters(), *buffers]:
                    dist.all_reduce(tensor)
                    tensor.div_(dist.get_world_size())


def main() -> None:
    out, periods = sys.argv[1], [int(s) for s in sys.argv[2:]]
    dist.init_process_group("gloo")
    runs: list[tuple[str, torch.nn.Module, int | None]] = [("ddp", DistributedDataParallel(make_layers()), None)]
    runs += [(f"local_sgd_{s}", make_layers(), s) for s in periods]
    for name, model, sync_every in runs:
        train(model, sync_every)
        if dist.get_rank() == 0:
            module = model.module if isinstance(model, DistributedDataParallel) else model
            torch.save(module.state_dict(), os.path.join(out, f"torchrun_{name}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's gloo can abort at interpreter shutdown in a process that made its own group (docs/ddp.md)
    sys.stdout.flush()
    os._exit(0)
