"""Run under torchrun: the plain DDP reference loop, then phalanx's "ddp" in the same workers.

Usage: torchrun ... plain_torchrun.py OUT_DIR NUM_NODES DEVICES
Under torchrun phalanx must take its ranks from the environment and launch nothing. The plain
loop's process group is left open: phalanx must use it, and leave it to its owner (this script).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from common import PhalanxNet, loader, plain_ddp_loop, state_to_lists, trainer_kwargs, write_json

import phalanx

if __name__ == "__main__":
    out, num_nodes, devices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    reference = plain_ddp_loop(destroy=False)
    users_group = dist.group.WORLD
    rank = int(os.environ["RANK"])
    write_json(os.path.join(out, f"reference{rank}.json"), {"state": state_to_lists(reference)})
    torch.manual_seed(0)
    model = PhalanxNet()
    trainer = phalanx.Trainer(**trainer_kwargs(devices=devices, num_nodes=num_nodes, strategy="ddp"))
    trainer.fit(model, loader())
    metrics = trainer.validate(model, loader(), verbose=False)
    kept = dist.is_initialized() and dist.group.WORLD is users_group
    if dist.is_initialized():
        dist.destroy_process_group()
    write_json(
        os.path.join(out, f"rank{trainer.global_rank}.json"),
        {
            "state": state_to_lists(model.state_dict()),
            "pid": os.getpid(),
            "global_rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "env": type(trainer.strategy.cluster_environment).__name__,
            "launcher": type(trainer.strategy.launcher).__name__,
            "children": len(getattr(trainer.strategy.launcher, "procs", [])),
            "validate": metrics,
            "users_group_kept": kept,
        },
    )
    # torch 2.13's gloo can abort at interpreter shutdown in a process that made its own group (docs/ddp.md)
    sys.stdout.flush()
    os._exit(0)
