"""ModelParallelStrategy's per-block options (checkpointing, regional compile), then plain FSDP2 by hand.

``python block_options.py OUT RUNS_JSON``; every rank does the runs in order, each a dict with
``tag`` and optional ``ac`` ("lightning": ``{Block}``; "full" / "selective":
``ActivationCheckpointing({Block}, mode=...)``), ``compile`` (a backend for
``compile_policy={Block}``), ``bad`` ("ac" or "compile": that policy names a class the model does
not have; the fit must raise, its message is recorded). The model is ``data_parallel_size=2``:
``configure_model`` shards each Block, then the root, with ``fully_shard``. After the fits, the
same ranks train the same layers with plain ``fully_shard`` on the same data shards.

Each rank writes ``OUT/blocks_rank<r>.json``: per tag the per-step local losses, how often the
Blocks' Python ``forward`` ran (recomputation runs it again in backward), how many matmuls
(``aten.mm`` / ``addmm``) the first step dispatched (selective checkpointing keeps their outputs,
full recomputes them), and for compiled runs whether each Block's ``forward`` was replaced and
how many graphs dynamo made.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mp_common import write_json
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import phalanx
from phalanx.callbacks import Callback
from phalanx.utilities.activation_checkpointing import ActivationCheckpointing
from phalanx_strategy_model_parallel import ModelParallelStrategy

WIDTH, SAMPLES, GLOBAL_BATCH, LR, BLOCKS = 16, 64, 16, 0.05, 3


class Block(nn.Module):
    """A residual MLP block; ``calls`` counts how often its eager Python forward runs.

    Not counted while dynamo traces it: a guard on the counter would recompile on every call.
    """

    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            Block.calls += 1
        return x + self.down(torch.tanh(self.up(x)))


def make_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(BLOCKS)), nn.Linear(WIDTH, 1))


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(SAMPLES, WIDTH, generator=generator), torch.randn(SAMPLES, 1, generator=generator))


def shard(layers: nn.Sequential, mesh: Any) -> None:
    for layer in layers:
        if isinstance(layer, Block):
            fully_shard(layer, mesh=mesh)
    fully_shard(layers, mesh=mesh)


class Net(phalanx.Module):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def configure_model(self) -> None:
        self.net = make_layers()
        shard(self.net, self.device_mesh["data_parallel"])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=LR)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(dataset(), batch_size=GLOBAL_BATCH // 2, shuffle=False)


class CountMatmuls(TorchDispatchMode):
    """Counts the matmuls dispatched on this thread (CPU backward runs on it too)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


class FirstStepMatmuls(Callback):
    """Counts the first training step's matmuls, forward, recomputation and backward included."""

    def __init__(self) -> None:
        self.count = 0
        self._mode: CountMatmuls | None = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self._mode = CountMatmuls()
            self._mode.__enter__()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self.count = self._mode.count
            self._mode = None


def _strategy(run: dict[str, Any]) -> ModelParallelStrategy:
    kwargs: dict[str, Any] = {}
    if run.get("ac") == "lightning":
        kwargs["activation_checkpointing_policy"] = {Block}
    elif run.get("ac"):
        kwargs["activation_checkpointing_policy"] = ActivationCheckpointing({Block}, mode=run["ac"])
    if run.get("compile"):
        kwargs["compile_policy"] = {Block}
        kwargs["compile_kwargs"] = {"backend": run["compile"]}
    if run.get("bad") == "ac":
        kwargs["activation_checkpointing_policy"] = {nn.Conv1d}
    elif run.get("bad") == "compile":
        kwargs["compile_policy"] = {nn.Conv1d}
    return ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, **kwargs)


def fit(out: str, run: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    matmuls = FirstStepMatmuls()
    trainer = phalanx.Trainer(
        accelerator="cpu", devices=2, strategy=_strategy(run), max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, default_root_dir=out,
        callbacks=[] if run.get("compile") else [matmuls],
    )  # fmt: skip
    model = Net()
    if run.get("bad"):
        try:
            trainer.fit(model)
        except Exception as error:
            return trainer.global_rank, {"error": f"{type(error).__name__}: {error}"}
        return trainer.global_rank, {"error": None}
    import torch._dynamo.utils

    graphs_before = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    Block.calls = 0
    trainer.fit(model)
    blocks = [m for m in model.net if isinstance(m, Block)]
    return trainer.global_rank, {
        "losses": model.losses,
        "block_calls": Block.calls,
        "matmuls_first_step": matmuls.count,
        "forward_replaced": all("forward" in vars(b) for b in blocks),
        "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]) - graphs_before,
    }


def plain_fsdp_losses() -> list[float]:
    """Plain torch: fully_shard per Block then the root over 2 ranks, DistributedSampler, AdamW."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    layers = make_layers()
    shard(layers, init_device_mesh("cpu", (dist.get_world_size(),)))
    optimizer = torch.optim.AdamW(layers.parameters(), lr=LR)
    data = dataset()
    sampler = DistributedSampler(data, dist.get_world_size(), dist.get_rank(), shuffle=False)
    losses = []
    for x, y in DataLoader(data, batch_size=GLOBAL_BATCH // 2, sampler=sampler):
        loss = F.mse_loss(layers(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def main(out: str, runs: list[dict[str, Any]]) -> None:
    results, rank = {}, 0
    for run in runs:
        rank, results[run["tag"]] = fit(out, run)
    results["plain"] = {"losses": plain_fsdp_losses()}
    write_json(os.path.join(out, f"blocks_rank{rank}.json"), results)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
