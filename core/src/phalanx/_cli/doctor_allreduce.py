"""One rank of ``phalanx doctor``'s gloo check: join a 2-process group and all-reduce a tensor.

Run as a script by ``phalanx doctor`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
set); exits non-zero with the reason when the sum is wrong or the group cannot form.
"""

from __future__ import annotations

if __name__ == "__main__":
    import datetime
    import os
    import sys

    import torch
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))
    try:
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        expected = world_size * (world_size + 1) / 2
        if value.item() != expected:
            print(f"rank {rank}: all_reduce gave {value.item()}, expected {expected}", file=sys.stderr)
            sys.exit(1)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print(f"rank {rank}: all_reduce ok ({value.item():g})")
