"""Two gloo ranks save an FSDP2-sharded model through ``phalanx.checkpoint_io.dcp`` and read it back.

``python dcp_two_ranks.py OUT MODE`` with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, as
torchrun would. MODE ``sync`` or ``async`` (``AsyncCheckpointIO``). The model is trained one step,
saved, trained another step (so the live weights differ from the saved ones while the background
write runs), then the checkpoint is read into a fresh sharded model, whose full weights rank 0
writes to ``OUT/<mode>_read.pt``. The saved step's full weights go to ``OUT/<mode>_saved.pt``.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from phalanx.checkpoint_io import AsyncCheckpointIO, TorchCheckpointIO, dcp


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + dist.get_rank())
    model(torch.randn(4, 6, generator=generator)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def full(model: nn.Module) -> dict[str, torch.Tensor]:
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def main(out: str, mode: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    io = AsyncCheckpointIO() if mode == "async" else TorchCheckpointIO()
    model, optimizer = build()
    step(model, optimizer, seed=1)
    saved = full(model)
    path = os.path.join(out, f"{mode}.ckpt")
    common = {"checkpoint_io": io, "is_global_zero": rank == 0, "barrier": dist.barrier, "world_size": 2}
    dcp.save({"global_step": 1}, path, model=model, optimizers=[optimizer], strategy="test", **common)
    step(model, optimizer, seed=2)  # changes the live weights while the save may still be written
    fresh, fresh_optimizer = build()
    checkpoint = dcp.read(path, model=fresh, optimizers=[fresh_optimizer], checkpoint_io=io)
    dcp.apply_model_state(fresh, checkpoint["state_dict"])
    dcp.apply_optimizer_states(fresh, [fresh_optimizer], checkpoint["optimizer_states"])
    read_back = full(fresh)
    io.teardown()
    if rank == 0:
        torch.save(saved, os.path.join(out, f"{mode}_saved.pt"))
        torch.save(read_back, os.path.join(out, f"{mode}_read.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    # torch 2.13's gloo can abort at interpreter shutdown in a process that made its own group (docs/ddp.md)
    sys.stdout.flush()
    os._exit(0)
