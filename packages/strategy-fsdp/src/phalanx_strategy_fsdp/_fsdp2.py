"""FSDP2's public names, wherever this torch version keeps them.

torch 2.4 and 2.5 ship ``fully_shard`` under ``torch.distributed._composable.fsdp``; 2.6 made it
public as ``torch.distributed.fsdp``. The package supports ``torch>=2.4``, so it imports from one
place and never repeats the fallback.
"""

from __future__ import annotations

try:
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import (  # type: ignore[no-redef]
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

__all__ = ["CPUOffloadPolicy", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "fully_shard"]
