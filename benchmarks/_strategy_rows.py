"""The rows of ``bench_strategies_vs_raw.py``: each strategy's model, data and training written two
ways, by hand (``raw_*``) and with ``phalanx.Trainer`` (``phalanx_*``), side by side; and the step
stamps (``now``) and Python-call counter (``counted``) both sides record with.

Every ``raw_*`` / ``phalanx_*`` function trains a fresh model for ``steps`` steps in the calling
process (a torchrun rank, or a replica group's process for the torchft rows) and returns each
step's start (:data:`Stamp`). ``ROWS`` maps a row's name to the pair and how its workers are
launched; the harness is in ``bench_strategies_vs_raw.py``.
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import phalanx

__all__ = ["DESCRIPTIONS", "QUICK_ROWS", "ROWS", "WARMUP", "Stamp", "counted", "now"]

WARMUP = 5
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
        marks = self.marks[WARMUP:]
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
