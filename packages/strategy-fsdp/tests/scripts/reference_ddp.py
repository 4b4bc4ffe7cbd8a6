"""Plain PyTorch DDP on gloo: the reference the FSDP runs must match (no phalanx involved).

Started once per rank by the test with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set. Mirrors
the Trainer's semantics: DistributedSampler(shuffle=False, seed=0), loss divided by the
accumulation count, no gradient sync inside an accumulation window, norm clipping before the step.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import ACCUMULATE, BATCH_SIZE, CLIP, EPOCHS, dataset, make_net, make_optimizer, write_json
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(make_net())
    optimizer = make_optimizer(model.parameters())
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False, seed=0)
    loader = DataLoader(data, batch_size=BATCH_SIZE, sampler=sampler)
    losses, weights_per_epoch = [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for index, (x, y) in enumerate(loader):
            if index % ACCUMULATE == 0:
                optimizer.zero_grad()
            step_now = (index + 1) % ACCUMULATE == 0
            with contextlib.nullcontext() if step_now else model.no_sync():
                loss = F.mse_loss(model(x), y)
                losses.append(float(loss.detach()))
                (loss / ACCUMULATE).backward()
            if step_now:
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
                optimizer.step()
        weights_per_epoch.append({k: v.clone() for k, v in model.module.state_dict().items()})
    write_json(os.path.join(out, f"ref_losses_rank{rank}.json"), losses)
    if rank == 0:
        torch.save(weights_per_epoch, os.path.join(out, "ref_weights.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    # torch 2.13's gloo can abort at interpreter shutdown in a process that made its own group (docs/ddp.md)
    sys.stdout.flush()
    os._exit(0)
