"""DeepSpeed fits with and without activation checkpointing, in the same two processes.

``python ds_activation_checkpointing.py OUT RUNS_JSON``; each run is ``{"tag", "stage", "ac"}`` with
``ac`` None, "full" or "selective" (on every Block). Each rank writes ``OUT/ac_rank<r>.json``: per
tag the per-step losses and the peak memory torch's MemTracker measured
while the layers ran forward and backward in the first step.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.callbacks import Callback
from phalanx.utilities.activation_checkpointing import ActivationCheckpointing
from phalanx_strategy_deepspeed import DeepSpeedStrategy

WIDTH, SAMPLES, BATCH = 32, 128, 32


class Block(nn.Module):
    """An MLP block whose 4x-wide hidden activations are what checkpointing frees."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)) * torch.sigmoid(self.up(x)))


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(SAMPLES, WIDTH, generator=generator), torch.randn(SAMPLES, 8, generator=generator))


class Net(Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(Block(), Block(), Block(), nn.Linear(WIDTH, 8))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(dataset(), batch_size=BATCH, shuffle=False)


class PeakMemory(Callback):
    """torch's MemTracker over the first training step: the peak while the layers run forward and backward.

    The job-wide peak is DeepSpeed's gradient buckets (about 1.6 GB under ZeRO-2, allocated in
    backward whatever the model), which hides the activations; the layers' own peak does not.
    """

    def __init__(self) -> None:
        self.peak = 0
        self._tracker: Any = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            from torch.distributed._tools.mem_tracker import MemTracker

            self._tracker = MemTracker()
            self._tracker.track_external(pl_module)
            self._tracker.__enter__()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            stats = self._tracker.memory_tracking[pl_module.net]
            self.peak = int(stats.local_peak[torch.device("cpu")])
            self._tracker = None


def fit(out: str, run: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    policy = ActivationCheckpointing({Block}, mode=run["ac"]) if run.get("ac") else None
    memory = PeakMemory()
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=out,
        callbacks=[memory],
        strategy=DeepSpeedStrategy(stage=run["stage"], activation_checkpointing_policy=policy),
    )
    model = Net()
    trainer.fit(model)
    return trainer.global_rank, {"losses": model.losses, "peak": memory.peak}


def main(out: str, runs: list[dict[str, Any]]) -> None:
    results, rank = {}, 0
    for run in runs:
        rank, results[run["tag"]] = fit(out, run)
    path = os.path.join(out, f"ac_rank{rank}.json")
    with open(f"{path}.{os.getpid()}.tmp", "w") as handle:
        json.dump(results, handle)
    os.replace(f"{path}.{os.getpid()}.tmp", path)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
