"""Model, data, parallelization and the plain-torch references shared by the runs and the tests.

Both sides import this file, so phalanx and the references train the same network from the same
initial weights with the same DTensor / pipelining calls; any difference comes from phalanx.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES, SAMPLES, GLOBAL_BATCH, LR = 8, 64, 8, 0.1


class MLP(nn.Module):
    """A residual two-layer block: w1 is split by columns, w2 by rows under tensor parallel."""

    #: Forward computations of every MLP in this process (activation checkpointing adds its recomputations).
    forward_calls = 0

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(FEATURES, hidden)
        self.w2 = nn.Linear(hidden, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        MLP.forward_calls += 1
        return x + self.w2(torch.tanh(self.w1(x)))


def make_net(hidden: int = 16, depth: int = 2) -> nn.Sequential:
    """``depth`` residual blocks and a head; weights fixed by seed, so every run (and every rank) starts identically."""
    torch.manual_seed(0)
    return nn.Sequential(*(MLP(hidden) for _ in range(depth)), nn.Linear(FEATURES, 1))


def parallelize(net: nn.Module, mesh: DeviceMesh) -> None:
    """Tensor parallel over mesh['tensor_parallel'], then FSDP2 over mesh['data_parallel'] (blocks, root)."""
    plan = {f"{i}.w1": ColwiseParallel() for i in (0, 1)} | {f"{i}.w2": RowwiseParallel() for i in (0, 1)}
    parallelize_module(net, mesh["tensor_parallel"], plan)
    for block in (net[0], net[1]):
        fully_shard(block, mesh=mesh["data_parallel"])
    fully_shard(net, mesh=mesh["data_parallel"])


def pipeline_stages(net: nn.Sequential) -> list[nn.Module]:
    return [nn.Sequential(net[0]), nn.Sequential(net[1], net[2])]


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(123)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(x, y)


def loader(dp_size: int, dp_rank: int | None = None) -> DataLoader:
    """Per-rank batches of GLOBAL_BATCH / dp; with dp_rank, sharded as DistributedSampler does."""
    data = dataset()
    sampler = None if dp_rank is None else DistributedSampler(data, num_replicas=dp_size, rank=dp_rank, shuffle=False)
    return DataLoader(data, batch_size=GLOBAL_BATCH // dp_size, shuffle=False, sampler=sampler)


def dp_mean(value: torch.Tensor, mesh: DeviceMesh) -> float:
    """The loss of the global batch: the mean over data-parallel ranks."""
    value = value.detach().float().clone()
    group = mesh["data_parallel"].get_group()
    dist.all_reduce(value, group=group)
    return float(value) / dist.get_world_size(group)


def single_process(
    epochs: int, *, depth: int = 2, batches: int | None = None, accumulate: int = 1
) -> tuple[list[float], nn.Sequential]:
    """The whole model on one process, full global batches: per-batch losses and the trained net.

    ``batches`` limits each epoch; ``accumulate`` sums the gradients of that many batches (each
    loss divided by it) before one optimizer step, as ``accumulate_grad_batches`` does.
    """
    net = make_net(depth=depth)
    opt = make_optimizer(net.parameters())
    losses = []
    for _ in range(epochs):
        for index, (x, y) in enumerate(loader(1)):
            if batches is not None and index == batches:
                break
            loss = loss_fn(net(x), y)
            (loss / accumulate).backward()
            losses.append(float(loss.detach()))
            if (index + 1) % accumulate == 0:
                opt.step()
                opt.zero_grad()
    return losses, net


def single_process_weights(epochs: int) -> dict[str, torch.Tensor]:
    """The whole model on one process, full global batches: what every mesh must converge to."""
    return {k: v.detach().clone() for k, v in single_process(epochs)[1].state_dict().items()}


def reference_tensor_parallel(mesh: DeviceMesh, epochs: int, precision: str = "32-true") -> list[float]:
    """Plain torch: the same TP plan + fully_shard, DistributedSampler over dp; per-step local losses.

    ``bf16-true`` builds the model in bfloat16 and feeds bfloat16 inputs; ``bf16-mixed`` runs
    forward and loss under ``torch.autocast("cpu", torch.bfloat16)``.
    """
    previous = torch.get_default_dtype()
    if precision == "bf16-true":
        torch.set_default_dtype(torch.bfloat16)
    try:
        net = make_net()
    finally:
        torch.set_default_dtype(previous)
    parallelize(net, mesh)
    opt = make_optimizer(net.parameters())
    dp = mesh["data_parallel"]
    data = loader(dp.size(), dp.get_local_rank())
    losses = []
    for epoch in range(epochs):
        data.sampler.set_epoch(epoch)
        for x, y in data:
            if precision == "bf16-true":
                x, y = x.bfloat16(), y.bfloat16()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
    return losses


def reference_pipeline(mesh: DeviceMesh, epochs: int, schedule: str, microbatches: int) -> list[float]:
    """Plain torch.distributed.pipelining: the same stage split, fully_shard per stage over dp."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    net = make_net()
    pp = mesh["pipeline_parallel"]
    rank = pp.get_local_rank()
    stage_module = pipeline_stages(net)[rank]
    if mesh["data_parallel"].size() > 1:
        fully_shard(stage_module, mesh=mesh["data_parallel"])
    opt = make_optimizer(stage_module.parameters())
    stage = PipelineStage(stage_module, rank, pp.size(), torch.device("cpu"), group=pp.get_group())
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = cls(stage, microbatches, loss_fn=loss_fn)
    dp = mesh["data_parallel"]
    data = loader(dp.size(), dp.get_local_rank())
    last = dist.get_global_rank(pp.get_group(), pp.size() - 1)
    losses = []
    for epoch in range(epochs):
        data.sampler.set_epoch(epoch)
        for x, y in data:
            mb: list[torch.Tensor] = []
            if rank == 0:
                sched.step(x)
            else:
                sched.step(target=y, losses=mb)
            value = torch.stack(mb).detach().mean() if mb else torch.zeros(())
            dist.broadcast(value, src=last, group=pp.get_group())
            opt.step()
            opt.zero_grad()
            losses.append(float(value))
    return losses


def write_json(path: str, value: Any) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # each writer its own: two ranks may write the same file
    with open(tmp, "w") as handle:
        json.dump(value, handle)
    os.replace(tmp, path)
