"""Every distributed strategy against the same training written by hand in plain PyTorch: step time.

Run:  python benchmarks/bench_strategies_vs_raw.py [--rows fsdp tp ...] [--steps 25 --blocks 8] [--quick]

Each row trains one model two ways on 2 CPU ranks (gloo, OMP_NUM_THREADS=1): the *raw* loop a user
writes with torch (or deepspeed, or torchft) alone, and ``phalanx.Trainer`` with the strategy. Both
run in the same worker processes, in alternating blocks (raw, phalanx, phalanx, raw, ...), so load
from other programs hits both alike. A block is a fresh model trained for ``--steps`` steps; its step
time is the median interval between step starts after ``_WARMUP`` steps. Reported per row: the
median over blocks of each side, the ratio phalanx / raw per block pair and its median (target
<= 1.02, wall clock), the same for the mean step, rank 0's CPU time per step and its fastest step,
the load average before and after the row, and, independent of load, the Python calls and the
collectives issued from Python per step on each side (counted over a few steps with
``sys.setprofile``: what phalanx adds, whatever the machine is doing).

Rows (one ``raw_*`` and one ``phalanx_*`` function each, side by side below):

* ``fsdp``: ``fully_shard`` on every block and the root, by hand.
* ``deepspeed_zero2`` / ``deepspeed_zero3``: ``deepspeed.initialize`` with the same config dict
  (DeepSpeed on CPU: ``DS_ACCELERATOR=cpu``).
* ``tp``: ``parallelize_module`` with a column/row-wise plan over 2 ranks, by hand.
* ``pp``: ``PipelineStage`` + ``Schedule1F1B`` over 2 stages, 4 microbatches, by hand.
* ``cp``: context parallel over 2 ranks. torch's ``context_parallel()`` fails on CPU in torch 2.13
  (no sharding strategy for the CPU flash-attention kernels), which is why phalanx does not use it;
  the raw loop does what phalanx does, by hand: each rank keeps two chunks of every sequence, the
  attention (not causal) all-gathers keys and values (autograd-aware), FSDP averages the gradients.
* ``ep``: expert parallel over 2 ranks: a top-2 MoE of 4 stacked experts, 2 per rank, the
  package's ``ExpertParallel`` style applied with ``parallelize_module`` (torch has none of its
  own) and ``fully_shard`` by hand; the row measures what the strategy and the Trainer add.
* ``ft_ddp``: a torchft ``Manager`` with torchft's ``DistributedDataParallel`` and
  ``OptimizerWrapper``, by hand: 2 replica groups of 1 rank, each its own process, joined by a
  lighthouse the harness starts (the cluster layout: ``PHALANX_FT_REPLICA_GROUP``).
* ``ft_diloco``: torchft's ``DiLoCo`` around the same Manager, Adam inside, Nesterov SGD outside,
  a sync every ``SYNC_EVERY`` steps, by hand; same layout as ``ft_ddp``. Its median step is an
  inner step; the mean (printed too) includes the syncs.

The pieces are small on purpose: each raw loop is the whole of what the user would write.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _bench import Row, child_env, finish
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import phalanx

__all__ = ["ROWS", "main"]

_WARMUP = 5
WIDTH, DEPTH, BATCH, LR = 256, 4, 32, 1e-3
#: context parallel: sequence length, model width, heads (a few ms of attention per step)
SEQ, DIM, HEADS = 256, 64, 4
MICROBATCHES = 4
#: expert parallel: experts (2 per rank) and tokens per rank and step
EXPERTS, EP_BATCH = 4, 128
#: ft_diloco: inner steps between syncs (short, so that every block holds several syncs)
SYNC_EVERY = 4


# ---------------------------------------------------------------- models and data (both sides)
class Block(nn.Module):
    """A residual MLP block: ``up`` splits by columns and ``down`` by rows under tensor parallel."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


def mlp() -> nn.Sequential:
    """``DEPTH`` blocks and a linear head; the same initial weights on every rank and side."""
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(DEPTH)), nn.Linear(WIDTH, 1))


def tp_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {f"{i}.up": ColwiseParallel() for i in range(DEPTH)} | {f"{i}.down": RowwiseParallel() for i in range(DEPTH)}


def pp_stages(net: nn.Module) -> list[nn.Module]:
    """Two stages: the first half of the blocks, then the rest with the head."""
    layers, half = list(net.children()), DEPTH // 2
    return [nn.Sequential(*layers[:half]), nn.Sequential(*layers[half:])]


class AttentionBlock(nn.Module):
    """Self-attention (not causal) + MLP. ``cp_group``: the raw context-parallel loop's gather."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)
        self.cp_group: dist.ProcessGroup | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        if self.cp_group is not None:  # raw context parallel: attend over every rank's keys and values
            from torch.distributed._functional_collectives import all_gather_single_autograd

            k = all_gather_single_autograd(k.contiguous(), 2, self.cp_group)
            v = all_gather_single_autograd(v.contiguous(), 2, self.cp_group)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.out(a.transpose(1, 2).reshape(batch, seq, DIM))
        return x + self.down(F.gelu(self.up(x)))


def attention_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(AttentionBlock(), AttentionBlock(), nn.Linear(DIM, DIM))


def mlp_data(steps: int, replicas: int, batch: int = BATCH) -> TensorDataset:
    """``steps`` batches of ``batch`` for each of ``replicas`` data-parallel ranks."""
    g = torch.Generator().manual_seed(0)
    n = batch * steps * replicas
    return TensorDataset(torch.randn(n, WIDTH, generator=g), torch.randn(n, 1, generator=g))


def sequence_data(steps: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    n = 4 * steps
    return TensorDataset(torch.randn(n, SEQ, DIM, generator=g), torch.randn(n, SEQ, DIM, generator=g))


def sharded_loader(data: TensorDataset) -> DataLoader:
    """What a raw data-parallel loop reads: this rank's share, as phalanx's sampler gives it."""
    return DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))


#: A step's start: (wall clock, this process's CPU time, gloo's threads included).
Stamp = tuple[float, float]
#: Collectives issued from Python (torch.distributed and its functional collectives), counted per step.
_COLLECTIVE_FILES = ("distributed_c10d.py", "_functional_collectives.py")
_COLLECTIVES = frozenset(
    {"all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "barrier",
     "isend", "irecv", "batch_isend_irecv", "broadcast_object_list", "all_gather_object", "all_gather_single",
     "reduce_scatter_single", "all_gather_tensor", "all_to_all_single_autograd", "all_gather_single_autograd",
     "reduce_scatter_single_autograd"}
)  # fmt: skip


class CallCounter:
    """A ``sys.setprofile`` hook: Python function calls and collectives; ``now()`` marks step starts."""

    def __init__(self) -> None:
        self.calls = 0
        self.collectives: Counter[str] = Counter()
        self.marks: list[tuple[int, Counter[str]]] = []

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1
            code = frame.f_code
            if code.co_name in _COLLECTIVES and code.co_filename.endswith(_COLLECTIVE_FILES):
                self.collectives[code.co_name] += 1

    def per_step(self) -> dict[str, Any]:
        """Python calls per step (median) and collectives per step, over the steps after the warm-up."""
        marks = self.marks[_WARMUP:]
        steps = len(marks) - 1
        calls = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(marks))
        collectives = {k: v / steps for k, v in sorted((marks[-1][1] - marks[0][1]).items())}
        return {"python_calls": calls, "collectives": collectives}


_COUNTER: CallCounter | None = None


def now() -> Stamp:
    if _COUNTER is not None:
        _COUNTER.marks.append((_COUNTER.calls, Counter(_COUNTER.collectives)))
    return time.perf_counter(), time.process_time()


def counted(run: Callable[[int], list[Stamp]], steps: int) -> dict[str, Any]:
    """Run ``steps`` steps under the call counter (load-independent: what each step does, not how long)."""
    global _COUNTER
    _COUNTER = counter = CallCounter()
    sys.setprofile(counter)
    try:
        run(steps)
    finally:
        sys.setprofile(None)
        _COUNTER = None
    return counter.per_step()


# ---------------------------------------------------------------- phalanx's side: one Module, one fit
class Timed(phalanx.Module):
    """Stamps each training step's start; MSE on ``self.net``; Adam, as the raw loops."""

    def __init__(self, net: nn.Module | None = None) -> None:
        super().__init__()
        if net is not None:
            self.net = net
        self.stamps: list[Stamp] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.stamps.append(now())
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=LR)


def fit(module: Timed, strategy: Any, data: TensorDataset, *, batch_size: int = BATCH, devices: int = 2) -> list[Stamp]:
    """``Trainer.fit`` with everything beside the loop switched off; returns the step stamps."""
    trainer = phalanx.Trainer(
        accelerator="cpu", devices=devices, strategy=strategy, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, DataLoader(data, batch_size=batch_size, shuffle=False))
    return module.stamps


# ---------------------------------------------------------------- fsdp
def raw_fsdp(steps: int) -> list[Stamp]:
    from torch.distributed.fsdp import fully_shard

    net = mlp()
    for block in list(net)[:DEPTH]:
        fully_shard(block)
    fully_shard(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    stamps = []
    for x, y in sharded_loader(mlp_data(steps, 2)):
        stamps.append(now())
        optimizer.zero_grad()
        F.mse_loss(net(x), y).backward()
        optimizer.step()
    return stamps


def phalanx_fsdp(steps: int) -> list[Stamp]:
    from phalanx_strategy_fsdp import FSDPStrategy

    return fit(Timed(mlp()), FSDPStrategy(auto_wrap_policy={Block}), mlp_data(steps, 2))


# ---------------------------------------------------------------- deepspeed ZeRO-2 / ZeRO-3
def ds_config(stage: int) -> dict[str, Any]:
    """The one config both sides use (phalanx adds nothing: batch size and accumulation are set)."""
    return {
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "zero_allow_untested_optimizer": True,
    }


def raw_deepspeed(stage: int, steps: int) -> list[Stamp]:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)  # joins the group
    net = mlp()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    engine, _, _, _ = deepspeed.initialize(
        model=net, optimizer=optimizer, config=ds_config(stage), dist_init_required=False
    )
    stamps = []
    for x, y in sharded_loader(mlp_data(steps, 2)):
        stamps.append(now())
        engine.backward(F.mse_loss(engine(x), y))
        engine.step()
    return stamps


def phalanx_deepspeed(stage: int, steps: int) -> list[Stamp]:
    from phalanx_strategy_deepspeed import DeepSpeedStrategy

    return fit(Timed(mlp()), DeepSpeedStrategy(config=ds_config(stage)), mlp_data(steps, 2))


# ---------------------------------------------------------------- tensor parallel
def raw_tp(steps: int) -> list[Stamp]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    net = parallelize_module(mlp(), init_device_mesh("cpu", (2,)), tp_plan())
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    stamps = []
    for x, y in DataLoader(mlp_data(steps, 1), batch_size=BATCH):  # both ranks read the same batch
        stamps.append(now())
        optimizer.zero_grad()
        F.mse_loss(net(x), y).backward()
        optimizer.step()
    return stamps


class TensorParallelMLP(Timed):
    def configure_model(self) -> None:
        from torch.distributed.tensor.parallel import parallelize_module

        self.net = parallelize_module(mlp(), self.device_mesh["tensor_parallel"], tp_plan())


def phalanx_tp(steps: int) -> list[Stamp]:
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)
    return fit(TensorParallelMLP(), strategy, mlp_data(steps, 1))


# ---------------------------------------------------------------- pipeline parallel
def raw_pp(steps: int) -> list[Stamp]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank = dist.get_rank()
    stage_module = pp_stages(mlp())[rank]
    stage = PipelineStage(stage_module, rank, 2, torch.device("cpu"))
    schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=F.mse_loss)
    optimizer = torch.optim.Adam(stage_module.parameters(), lr=LR)
    stamps = []
    for x, y in DataLoader(mlp_data(steps, 1), batch_size=BATCH):  # both stages read the same batch
        stamps.append(now())
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        optimizer.step()
    return stamps


class PipelinedMLP(Timed):
    def configure_model(self) -> None:
        self.net = mlp()

    def pipeline_stages(self) -> list[nn.Module]:
        return pp_stages(self.net)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.stamps.append(now())
        x, y = batch
        return self.trainer.strategy.run_pipeline(x, target=y, loss_fn=F.mse_loss)


def phalanx_pp(steps: int) -> list[Stamp]:
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    strategy = ModelParallelStrategy(
        data_parallel_size=1, tensor_parallel_size=1, pipeline_parallel_size=2, pipeline_schedule="1f1b",
        num_microbatches=MICROBATCHES,
    )  # fmt: skip
    return fit(PipelinedMLP(), strategy, mlp_data(steps, 1))


# ---------------------------------------------------------------- context parallel
def raw_cp(steps: int) -> list[Stamp]:
    from torch.distributed.fsdp import fully_shard

    rank, size = dist.get_rank(), 2
    net = attention_net()
    for block in net.modules():
        if isinstance(block, AttentionBlock):
            block.cp_group = dist.group.WORLD
    fully_shard(net)  # the ranks see different tokens of the same sequences: average their gradients
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    stamps = []
    for x, y in DataLoader(sequence_data(steps), batch_size=4):  # both ranks read the same sequences
        stamps.append(now())
        chunks_x, chunks_y = x.chunk(2 * size, dim=1), y.chunk(2 * size, dim=1)  # keep chunks i and 2*size-1-i
        x = torch.cat([chunks_x[rank], chunks_x[2 * size - 1 - rank]], dim=1)
        y = torch.cat([chunks_y[rank], chunks_y[2 * size - 1 - rank]], dim=1)
        optimizer.zero_grad()
        F.mse_loss(net(x), y).backward()
        optimizer.step()
    return stamps


class ContextParallelNet(Timed):
    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        self.net = attention_net()
        fully_shard(self.net, mesh=self.trainer.strategy.fsdp_mesh)


def phalanx_cp(steps: int) -> list[Stamp]:
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1, context_parallel_size=2)
    return fit(ContextParallelNet(), strategy, sequence_data(steps), batch_size=4)


# ---------------------------------------------------------------- expert parallel
class MoENet(nn.Module):
    """Linear -> residual MoE (``EXPERTS`` stacked experts, top-2 routing) -> head."""

    def __init__(self) -> None:
        from phalanx_strategy_model_parallel import MoE

        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.moe = MoE(WIDTH, 2 * WIDTH, EXPERTS, top_k=2)
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        return self.head(h + self.moe(h))


def moe_loss(net: MoENet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(net(x), y) + 0.01 * net.moe.aux_loss  # with the router's load-balancing loss


def raw_ep(steps: int) -> list[Stamp]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from phalanx_strategy_model_parallel import ExpertParallel  # torch has no expert-parallel style of its own

    net = MoENet()
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("expert_data_parallel", "expert_parallel"))
    parallelize_module(net.moe.experts, mesh["expert_parallel"], ExpertParallel())  # 2 experts per rank
    fully_shard(net.moe.experts, mesh=mesh["expert_data_parallel"])  # the ranks holding the same experts: 1
    fully_shard(net)  # everything else: FSDP over both ranks
    net.moe.load_balance_group = dist.group.WORLD  # the router's token counts over the global batch
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    data = mlp_data(steps, 2, EP_BATCH)
    stamps = []
    for x, y in DataLoader(data, batch_size=EP_BATCH, sampler=DistributedSampler(data, shuffle=False)):
        stamps.append(now())
        optimizer.zero_grad()
        moe_loss(net, x, y).backward()
        optimizer.step()
    return stamps


class ExpertParallelMoE(Timed):
    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        from phalanx_strategy_model_parallel import ExpertParallel

        strategy = self.trainer.strategy
        self.net = MoENet()
        parallelize_module(self.net.moe.experts, self.device_mesh["expert_parallel"], ExpertParallel())
        fully_shard(self.net.moe.experts, mesh=strategy.expert_fsdp_mesh)
        fully_shard(self.net, mesh=strategy.fsdp_mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.stamps.append(now())
        x, y = batch
        return moe_loss(cast(MoENet, self.net), x, y)


def phalanx_ep(steps: int) -> list[Stamp]:
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, expert_parallel_size=2)
    return fit(ExpertParallelMoE(), strategy, mlp_data(steps, 2, EP_BATCH), batch_size=EP_BATCH)


# ---------------------------------------------------------------- torchft: one process per replica group
def raw_manager(net: nn.Module, optimizer: torch.optim.Optimizer, name: str, store: Any, **options: Any) -> Any:
    """This group's torchft Manager, as phalanx makes it (one rank per group, synchronous quorum).

    ``store``: this group's TCPStore; it serves only while the caller holds it.
    """
    from datetime import timedelta

    from torchft import Manager
    from torchft.process_group import ProcessGroupGloo

    return Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=30)),
        load_state_dict=lambda state: (net.load_state_dict(state["model"]), optimizer.load_state_dict(state["optim"])),
        state_dict=lambda: {"model": net.state_dict(), "optim": optimizer.state_dict()},
        min_replica_size=1, use_async_quorum=False, timeout=timedelta(seconds=30),
        rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
        lighthouse_addr=os.environ["TORCHFT_LIGHTHOUSE"], replica_id=f"{name}_{os.environ['PHALANX_FT_REPLICA_GROUP']}",
        **options,
    )  # fmt: skip


def group_loader(steps: int) -> DataLoader:
    """This replica group's half of the data (each group is one rank of a 2-rank data-parallel job)."""
    data = mlp_data(steps, 2)
    group = int(os.environ["PHALANX_FT_REPLICA_GROUP"])
    return DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, 2, group, shuffle=False))


def raw_ft_ddp(steps: int) -> list[Stamp]:
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper

    net = mlp()
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = raw_manager(net, optimizer, "raw_ft_ddp", store)
    model = DistributedDataParallel(manager, net)
    ft_optimizer = OptimizerWrapper(manager, optimizer)
    stamps = []
    for x, y in group_loader(steps):
        stamps.append(now())
        ft_optimizer.zero_grad()  # starts the quorum
        F.mse_loss(model(x), y).backward()  # gradients averaged across the groups in the quorum
        ft_optimizer.step()  # steps only if every rank agrees the step commits
    manager.shutdown(wait=False)
    return stamps


def phalanx_ft_ddp(steps: int) -> list[Stamp]:
    from phalanx_strategy_torchft import FTDDPStrategy

    strategy = FTDDPStrategy(replica_groups=2, timeout=30, quorum_timeout=60)
    return fit(Timed(mlp()), strategy, mlp_data(steps, 2), devices=1)


def raw_ft_diloco(steps: int) -> list[Stamp]:
    from torchft.local_sgd import DiLoCo

    net = mlp()
    inner = torch.optim.Adam(net.parameters(), lr=LR)
    outer = torch.optim.SGD(net.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = raw_manager(net, inner, "raw_ft_diloco", store, init_sync=False)
    stamps = []
    with DiLoCo(manager, [net], inner, outer, sync_every=SYNC_EVERY):
        for x, y in group_loader(steps):
            stamps.append(now())
            inner.zero_grad()
            F.mse_loss(net(x), y).backward()
            inner.step()  # every SYNC_EVERY steps DiLoCo's hook averages the groups' pseudo-gradients, outer step
    manager.shutdown(wait=False)
    return stamps


def phalanx_ft_diloco(steps: int) -> list[Stamp]:
    from phalanx_strategy_torchft import FTDiLoCoStrategy

    strategy = FTDiLoCoStrategy(replica_groups=2, sync_every=SYNC_EVERY, timeout=30, quorum_timeout=60)
    return fit(Timed(mlp()), strategy, mlp_data(steps, 2), devices=1)


#: row -> (raw loop, phalanx fit, how the worker processes are started: "torchrun" or "ft_groups")
ROWS: dict[str, tuple[Callable[[int], list[Stamp]], Callable[[int], list[Stamp]], str]] = {
    "fsdp": (raw_fsdp, phalanx_fsdp, "torchrun"),
    "deepspeed_zero2": (lambda s: raw_deepspeed(2, s), lambda s: phalanx_deepspeed(2, s), "torchrun"),
    "deepspeed_zero3": (lambda s: raw_deepspeed(3, s), lambda s: phalanx_deepspeed(3, s), "torchrun"),
    "tp": (raw_tp, phalanx_tp, "torchrun"),
    "pp": (raw_pp, phalanx_pp, "torchrun"),
    "cp": (raw_cp, phalanx_cp, "torchrun"),
    "ep": (raw_ep, phalanx_ep, "torchrun"),
    "ft_ddp": (raw_ft_ddp, phalanx_ft_ddp, "ft_groups"),
    "ft_diloco": (raw_ft_diloco, phalanx_ft_diloco, "ft_groups"),
}
#: What ``--quick`` runs, in one torchrun launch (about half a minute): the DeepSpeed rows (DeepSpeed's
#: import alone takes ~20 s of a loaded core) and the torchft rows (a lighthouse and two more
#: processes each) are left out; packages/strategy-deepspeed's and strategy-torchft's tests run
#: those paths. ``--quick --rows ...`` runs any rows.
QUICK_ROWS = ("fsdp", "tp", "pp", "cp", "ep")
DESCRIPTIONS = {
    "fsdp": "fsdp / fully_shard by hand",
    "deepspeed_zero2": "deepspeed ZeRO-2 / deepspeed.initialize",
    "deepspeed_zero3": "deepspeed ZeRO-3 / deepspeed.initialize",
    "tp": "model_parallel tp=2 / parallelize_module",
    "pp": "model_parallel pp=2 1F1B / PipelineStage+Schedule1F1B",
    "cp": "model_parallel cp=2 / all-gather attention by hand",
    "ep": "model_parallel ep=2 MoE / ExpertParallel + fully_shard",
    "ft_ddp": "ft_ddp 2 groups / torchft Manager+DDP",
    "ft_diloco": f"ft_diloco 2 groups, sync every {SYNC_EVERY} / torchft DiLoCo",
}


# ---------------------------------------------------------------- the worker: alternating blocks
def run_worker(row: str, steps: int, blocks: int, out: str) -> None:
    """Alternate raw and phalanx blocks (raw first in even blocks, phalanx first in odd ones)."""
    raw, ours, _ = ROWS[row]
    if not dist.is_initialized() and ROWS[row][2] == "torchrun":
        dist.init_process_group("gloo")  # phalanx's fits reuse this group, as in a torchrun script
    result: dict[str, Any] = {"raw": [], "phalanx": []}
    for block in range(blocks):
        order = (("raw", raw), ("phalanx", ours)) if block % 2 == 0 else (("phalanx", ours), ("raw", raw))
        for side, run in order:
            result[side].append(run(steps))
    result["counted"] = {"raw": counted(raw, _WARMUP + 4), "phalanx": counted(ours, _WARMUP + 4)}
    rank = dist.get_rank() if ROWS[row][2] == "torchrun" else int(os.environ["PHALANX_FT_REPLICA_GROUP"])
    if rank == 0:
        Path(out, f"{row}.json").write_text(json.dumps(result))


def _exit_now() -> None:
    """Leave without interpreter shutdown once results are written (a gloo thread may abort it: docs/ddp.md)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------- the harness
def _launch(rows: list[str], args: argparse.Namespace, out: str) -> None:
    """One launch of the workers for ``rows`` (torchrun rows only, when several)."""
    me = os.path.abspath(__file__)
    worker = [me, "--role", "worker", "--rows", *rows, "--out", out, "--steps", str(args.steps), "--blocks", str(args.blocks)]  # fmt: skip
    env = child_env(DS_ACCELERATOR="cpu", RUST_LOG="error")
    row = " ".join(rows)
    if ROWS[rows[0]][2] == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *worker]
        _check(subprocess.run(command, env=env, capture_output=True, text=True, timeout=900), row)
        return
    lighthouse = subprocess.Popen(
        [sys.executable, "-m", "phalanx_strategy_torchft.lighthouse", "--bind", "127.0.0.1:0", "--min-replicas", "2",
         "--join-timeout-ms", "1000", "--heartbeat-timeout-ms", "1000"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert lighthouse.stdout is not None
        address = lighthouse.stdout.readline().strip()
        groups = [
            subprocess.Popen(
                [sys.executable, *worker],
                env={**env, "PHALANX_FT_REPLICA_GROUP": str(g), "TORCHFT_LIGHTHOUSE": address},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for g in (0, 1)
        ]
        for g in groups:
            output, _ = g.communicate(timeout=900)
            _check(subprocess.CompletedProcess(g.args, g.returncode, output, ""), row)
    finally:
        lighthouse.terminate()
        lighthouse.wait(30)


def _check(result: subprocess.CompletedProcess[str], row: str) -> None:
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        msg = f"row {row}: the workers exited with {result.returncode}"
        raise SystemExit(msg)


def _block_ms(
    stamps: list[list[float]], clock: int = 0, stat: Callable[[list[float]], float] = statistics.median
) -> float:
    """Interval between step starts after the warm-up, in ms: ``clock`` 0 wall, 1 CPU; median or min."""
    kept = stamps[_WARMUP:]
    return 1000 * stat([b[clock] - a[clock] for a, b in itertools.pairwise(kept)])


def _measures(blocks: dict[str, list[list[list[float]]]]) -> dict[str, Any]:
    """Per measure: each side's median over blocks, the ratio per block pair and its median.

    ``wall``: median wall-clock step (the target). ``mean wall``: with the rare steps (ft_diloco's
    syncs) and every disturbance. ``cpu``: median CPU time per step of rank 0 (what load from
    other programs disturbs least). ``fastest cpu``: the step that used the least CPU time (the
    least disturbed one on a shared machine).
    """
    result: dict[str, Any] = {}
    measures = (("wall", 0, statistics.median), ("mean wall", 0, statistics.fmean), ("cpu", 1, statistics.median),
                ("fastest cpu", 1, min))  # fmt: skip
    for name, clock, stat in measures:
        raw = [_block_ms(s, clock, stat) for s in blocks["raw"]]
        ours = [_block_ms(s, clock, stat) for s in blocks["phalanx"]]
        ratios = [o / r for o, r in zip(ours, raw)]
        result[name] = {"raw": statistics.median(raw), "phalanx": statistics.median(ours), "ratios": ratios,
                        "ratio": statistics.median(ratios), "raw_ms": raw, "phalanx_ms": ours}  # fmt: skip
    return result


def main() -> int:
    """Workers run their blocks; the harness launches each row, prints it and the target rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--steps", type=int, default=25, help="steps per block (the first few are warm-up)")
    parser.add_argument("--blocks", type=int, default=8, help="blocks per side (medians are reported)")
    parser.add_argument("--quick", action="store_true", help="one short block per side: proves it runs")
    parser.add_argument("--role", choices=("worker",), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "worker":
        for row in args.rows:
            run_worker(row, args.steps, args.blocks, args.out)
        _exit_now()
    launches = [[row] for row in args.rows]  # a fresh pair of processes per row
    if args.quick:
        args.steps, args.blocks = _WARMUP + 3, 1
        if args.rows == list(ROWS):
            args.rows = list(QUICK_ROWS)
        launches = [list(args.rows)] if all(ROWS[r][2] == "torchrun" for r in args.rows) else [[r] for r in args.rows]
    print(f"2 CPU processes, gloo, OMP_NUM_THREADS=1; {args.blocks} blocks per side of {args.steps} steps "
          f"(first {_WARMUP} of each block are warm-up)")  # fmt: skip
    rows: list[Row] = []
    data: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as out:
        for launch in launches:
            started, load_before = time.perf_counter(), os.getloadavg()[0]
            _launch(launch, args, out)
            load = (load_before, os.getloadavg()[0])
            rows += _report(launch, out, data, load, time.perf_counter() - started)
    return finish("strategies_vs_raw", rows, data, quick=args.quick, partial=set(args.rows) != set(ROWS))


def _report(launch: list[str], out: str, data: dict[str, Any], load: tuple[float, float], seconds: float) -> list[Row]:
    """Print each row of one launch, record it in ``data``, return its target rows."""
    rows = []
    for row in launch:
        blocks = json.loads(Path(out, f"{row}.json").read_text())
        data[row] = {"timing": _measures(blocks), "per_step": blocks["counted"], "load_1min_before_after": load}
        print(f"  {row} ({seconds:.0f} s, load {load[0]:.1f} -> {load[1]:.1f})")
        for name, m in data[row]["timing"].items():
            shown = ", ".join(f"{x:.3f}" for x in m["ratios"])
            print(f"    {name:<13} raw {m['raw']:7.2f} ms  phalanx {m['phalanx']:7.2f} ms  "
                  f"ratio {m['ratio']:.3f}  (per block pair: {shown})")  # fmt: skip
        for side, c in blocks["counted"].items():
            print(f"    {side:<8} per step: {c['python_calls']:6.0f} Python calls, collectives {c['collectives']}")
        wall, cpu = data[row]["timing"]["wall"], data[row]["timing"]["cpu"]
        rows.append(Row(f"2-rank {DESCRIPTIONS[row]} (wall)", wall["ratio"], 1.02, "x",
                        low=min(wall["ratios"]), high=max(wall["ratios"]),
                        note=f"{wall['raw']:.2f} -> {wall['phalanx']:.2f} ms; CPU time {cpu['ratio']:.3f}; "
                        f"load {load[0]:.1f}-{load[1]:.1f}"))  # fmt: skip
    return rows


if __name__ == "__main__":
    sys.exit(main())
