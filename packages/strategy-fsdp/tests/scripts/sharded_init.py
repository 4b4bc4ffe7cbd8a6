"""Sharded initialisation: a model built in ``configure_model`` never exists in full on any rank.

``python sharded_init.py OUT``. Builds 16 blocks of 1024x1024 linear layers (about 67 MB of float32
weights) on the meta device, shards them over 2 ranks and trains one bf16-mixed step. Each rank
records how much its resident memory grew from just before building the model to its peak after
setup (``ru_maxrss``, which includes every allocation made meanwhile), next to the model's full size.
The peak is reset just before the build (``/proc/self/clear_refs``), so an earlier spike (imports,
process-group setup) is not counted as growth. The resident set also moves with the allocator and
the machine's load, so the tensors themselves are counted too: torch's memory tracker, entered just
before the build, records the peak of live CPU tensor bytes until setup ends (deterministic; a rank
that materialised the whole model even for a moment would reach ``full``).
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

import torch
import torch.nn.functional as F
from common import write_json
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

import phalanx
from phalanx.testing.memory_probe import PeakTracker
from phalanx_strategy_fsdp import FSDPStrategy

WIDTH, DEPTH = 1024, 16


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> None:
    """Make the kernel's high-water mark the current resident size (Linux 4.0+: ``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Big(phalanx.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers: nn.Sequential | None = None
        self.record: dict[str, Any] = {}
        self.tracker: PeakTracker | None = None

    def configure_model(self) -> None:
        # torch spends ~30 MB once, on the first fully_shard call of a process (lazy imports, dispatch
        # tables), whatever the model size; pay it on a tiny module so the measurement shows the model.
        fully_shard(nn.Linear(2, 2), mesh=self.trainer.strategy.device_mesh)
        _reset_peak_rss()
        self.record["rss_before"] = _rss_bytes()
        self.tracker = PeakTracker()
        self.tracker.__enter__()  # left in on_fit_start, once setup has sharded and materialised the model
        self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
        self.record["built_on_meta"] = all(p.is_meta for p in self.layers.parameters())

    def on_fit_start(self) -> None:
        self.record["peak_after_setup"] = _peak_rss_bytes()
        assert self.tracker is not None
        peak = self.tracker.get_tracker_snapshot("peak")
        self.tracker.__exit__(None, None, None)
        self.record["tracked_cpu_peak"] = sum(
            snap["Total"] for device, snap in peak.items() if torch.device(device).type == "cpu"
        )
        params = list(self.parameters())
        self.record["full_bytes"] = sum(p.numel() * p.element_size() for p in params)
        self.record["local_bytes"] = sum(
            p.to_local().numel() * p.element_size() for p in params if isinstance(p, DTensor)
        )
        self.record["all_dtensor"] = all(isinstance(p, DTensor) for p in params)
        self.record["weight_std"] = float(params[0].detach().to_local().float().std())
        self.record["param_dtype"] = str(params[0].dtype)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        out = self.layers(x)
        self.record["compute_dtype"] = str(out.dtype)
        loss = F.mse_loss(out.float(), torch.zeros_like(out, dtype=torch.float32))
        self.record["loss"] = float(loss.detach())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            TensorDataset(torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(0))), batch_size=4
        )


def main(out: str) -> None:
    strategy = FSDPStrategy(auto_wrap_policy={nn.Linear})
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        precision="bf16-mixed",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=out,
    )
    model = Big()
    trainer.fit(model)
    write_json(os.path.join(out, f"init_rank{trainer.global_rank}.json"), model.record)


if __name__ == "__main__":
    main(sys.argv[1])
