"""The phalanx side of the tests' runs: the Module, and two callbacks that observe a restart."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import torch
from ray_case import BATCH, LR, MOMENTUM, full_state, make_dataset, make_layers
from torch.utils.data import DataLoader

from phalanx import Module
from phalanx.callbacks import Callback


class Net(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = make_layers()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layers(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(make_dataset(), batch_size=BATCH, shuffle=False)


def train_loader() -> DataLoader:
    """The same data as ``Net.train_dataloader``, for ``phalanx_ray.fit(build_data=...)``."""
    return DataLoader(make_dataset(), batch_size=BATCH, shuffle=False)


class KillPoint(Callback):
    """On the first attempt, rank 1 writes its pid before step ``at_step`` and stops there for good.

    The test kills it (SIGKILL) as soon as the pid file appears: a worker dying mid-fit at a known
    step, killed from outside like any crash. Later attempts find the file and go on.
    """

    def __init__(self, folder: str, at_step: int) -> None:
        self.pid_file = Path(folder) / "worker.pid"
        self.at_step = at_step

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_rank == 1 and trainer.global_step == self.at_step and not self.pid_file.exists():
            partial = self.pid_file.with_suffix(".partial")
            partial.write_text(str(os.getpid()))
            partial.rename(self.pid_file)
            threading.Event().wait()  # never set: this worker waits for its SIGKILL


class Journal(Callback):
    """Each rank notes the checkpoint each attempt resumed from; rank 0 saves the final weights."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        with open(self.folder / f"starts_rank{trainer.global_rank}.txt", "a") as log:
            log.write(f"{trainer.ckpt_path}\n")
        # What ckpt_path="last" weighs besides the Trainer's own directories (RayEnvironment's answer).
        with open(self.folder / f"kept_rank{trainer.global_rank}.txt", "a") as log:
            log.write(f"{trainer.strategy.cluster_environment.last_checkpoint()}\n")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        state = full_state(pl_module.layers)
        if trainer.is_global_zero:
            torch.save(state, self.folder / "final.pt")
