"""An eager and a ``torch.compile``-d ddp fit of one model, then plain data parallel on the same ranks.

Usage: ``python compile_fit.py OUT_DIR``. Both fits run in the same two processes (the script is
re-run once, for rank 1): first ``trainer.fit(model)``, then ``trainer.fit(torch.compile(model,
backend="aot_eager"))`` on a fresh model with the same initial weights, then plain
data-parallel training by hand (gradients all-reduced, ``DistributedSampler``).
``aot_eager`` runs dynamo and AOT autograd (DDP's graph splitting included) without generating
C++, so the job stays short on a CPU. Rank r writes ``OUT_DIR/compile_rank<r>.json``: per run the
per-step local losses, and for the compiled fit whether ``forward`` was really compiled, how many
graphs dynamo made and the compile reports this rank logged.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from common import BATCH_SIZE, EPOCHS, LR, SEED, build_layers, dataset, loader, trainer_kwargs, write_json
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, DistributedSampler

import phalanx

REPORT = "torch.compile under strategy='ddp'"


class LossNet(phalanx.Module):
    """The scripts' layers, recording each step's local loss (the step stays eager when compiled)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.net = build_layers()
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=LR)


class Keep(logging.Handler):
    """Collects the messages of phalanx's compile logger on this rank."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def fit(compiled: bool) -> tuple[int, dict[str, Any]]:
    trainer = phalanx.Trainer(**trainer_kwargs(devices=2, strategy="ddp"))
    model = LossNet()
    trainer.fit(torch.compile(model, backend="aot_eager") if compiled else model, loader())
    result: dict[str, Any] = {"losses": model.losses}
    if compiled:
        result["forward_compiled"] = "forward" in vars(model)
        result["graphs"] = int(counters["stats"]["unique_graphs"])
    return trainer.global_rank, result


def plain_ddp_losses(out: str, rank: int) -> list[float]:
    """Data-parallel training by hand: DistributedSampler(seed=0) + set_epoch, averaged gradients, Adam.

    The gradients are all-reduced after ``backward`` rather than by ``DistributedDataParallel``:
    the same average, but no collective is issued from inside ``backward``. Under torch 2.13 a
    gloo work started there keeps backward's Python context in its thread-local state, and freeing
    the DDP wrapper can then deadlock (the group's destructor joins a gloo thread, holding the GIL,
    while that thread waits for the GIL to drop the context). The ranks meet through a file
    store: only the re-run rank keeps the launcher's variables.
    """
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out, 'plain_store')}", rank=rank, world_size=2)
    torch.manual_seed(SEED)
    model = build_layers()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    sampler: DistributedSampler[Any] = DistributedSampler(dataset(), shuffle=True, seed=0)
    data = DataLoader(dataset(), batch_size=BATCH_SIZE, sampler=sampler)
    losses = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in data:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            for parameter in model.parameters():
                assert parameter.grad is not None
                dist.all_reduce(parameter.grad)
                parameter.grad /= 2
            optimizer.step()
            losses.append(float(loss.detach()))
    dist.destroy_process_group()
    return losses


def main(out: str) -> None:
    keep = Keep()
    logging.getLogger("phalanx.compile").addHandler(keep)
    results: dict[str, Any] = {}
    _, results["eager"] = fit(compiled=False)
    rank, results["compiled"] = fit(compiled=True)
    results["compiled"]["reports"] = [m for m in keep.messages if REPORT in m]
    results["plain"] = {"losses": plain_ddp_losses(out, rank)}
    write_json(os.path.join(out, f"compile_rank{rank}.json"), results)


if __name__ == "__main__":
    main(sys.argv[1])
