"""FSDP fits with compile, activation checkpointing and float8, then plain FSDP2 + torchao by hand.

``python compile_ac_float8.py OUT RUNS_JSON``; each run is a dict with ``tag`` and optional
``compile`` (a torch.compile backend: the Module is given to fit as ``torch.compile(model)``),
``strategy`` (FSDPStrategy kwargs; ``"ac"`` = "full" | "selective" on Block, ``"regional"`` = a
backend compiling each Block), ``float8`` (precision=Float8Precision()). After the fits, the same
two ranks train plain ``fully_shard`` + ``convert_to_float8_training`` on the same batches. Each
rank writes ``OUT/h5_rank<r>.json``: per tag the per-step losses, the peak memory FSDPMemTracker
measured over the first step, and for float8 which weights were all-gathered as float8.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import write_json
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import phalanx
from phalanx.callbacks import Callback
from phalanx.precision.float8 import Float8Precision, float8_config
from phalanx.utilities.activation_checkpointing import ActivationCheckpointing
from phalanx_strategy_fsdp import FSDPStrategy

#: 256 samples a step per rank: activations far above one block's parameters, so the peaks of the
#: checkpointing modes stay apart by more than FSDPMemTracker varies (test_fsdp_compile_ac_float8.py).
WIDTH, SAMPLES, BATCH, LR = 32, 1024, 256, 0.01


class Block(nn.Module):
    """An MLP block: its 4x-wide hidden activations are what checkpointing saves."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)) * torch.sigmoid(self.up(x)))


def make_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block(), Block(), nn.Linear(WIDTH, 16))


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    return TensorDataset(
        torch.randn(SAMPLES, WIDTH, generator=generator), torch.randn(SAMPLES, 16, generator=generator)
    )


class Net(phalanx.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_layers()
        self.losses: list[float] = []
        #: The memory runs call the layers directly: torch's memory trackers refuse a module called
        #: twice per step, and the root is (the step redirect, then ``self(x)``).
        self.through_forward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x) if self.through_forward else self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=LR)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(dataset(), batch_size=BATCH, shuffle=False)


class PeakMemory(Callback):
    """torch's FSDPMemTracker over the first training step: the real per-rank peak, not a sampled one."""

    def __init__(self) -> None:
        self.peak = 0
        self._tracker: Any = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            self._tracker = FSDPMemTracker(pl_module, trainer.optimizers[0])
            self._tracker.__enter__()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            self.peak = int(self._tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
            self._tracker = None


def _strategy(options: dict[str, Any]) -> FSDPStrategy:
    kwargs: dict[str, Any] = {"auto_wrap_policy": {Block}}
    if options.get("ac") == "lightning":
        kwargs["activation_checkpointing_policy"] = {Block}
    elif options.get("ac"):
        kwargs["activation_checkpointing_policy"] = ActivationCheckpointing({Block}, mode=options["ac"])
    if options.get("regional"):
        kwargs["compile_policy"] = {Block}
        kwargs["compile_kwargs"] = {"backend": options["regional"]}
    return FSDPStrategy(**kwargs)


def _broken_backend(graph: Any, example_inputs: Any) -> Any:
    msg = "this backend cannot compile anything"
    raise RuntimeError(msg)


def fit(out: str, run: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    memory = PeakMemory()
    precision = Float8Precision() if run.get("float8") else "32-true"
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=_strategy(run.get("strategy", {})),
        precision=precision,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=out,
        callbacks=[memory] if run.get("memory") else None,
    )
    model = Net()
    model.through_forward = not run.get("memory")
    backend = _broken_backend if run.get("compile") == "broken" else run.get("compile")
    given: Any = torch.compile(model, backend=backend) if backend else model
    if run.get("expect_error"):
        try:
            trainer.fit(given)
        except Exception as error:
            return trainer.global_rank, {"error": f"{type(error).__name__}: {error}"}
        return trainer.global_rank, {"error": None}
    start = time.perf_counter()
    trainer.fit(given)
    result: dict[str, Any] = {"losses": model.losses, "peak": memory.peak, "seconds": time.perf_counter() - start}
    if run.get("float8"):
        weight = model.net[0].up.weight
        result["float8_gather"] = type(getattr(weight, "_local_tensor", weight)).__name__
    return trainer.global_rank, result


def float8_by_hand() -> list[float]:
    """Plain torch: torchao's conversion, fully_shard per Block then the root, AdamW, the same shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchao.float8 import convert_to_float8_training

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    model = make_layers()
    convert_to_float8_training(model, config=float8_config("tensorwise", fsdp_float8_all_gather=True))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for module in model:
        if isinstance(module, Block):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    data = dataset()
    sampler = DistributedSampler(data, dist.get_world_size(), dist.get_rank(), shuffle=False)
    losses = []
    for x, y in DataLoader(data, batch_size=BATCH, sampler=sampler):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def main(out: str, runs: list[dict[str, Any]]) -> None:
    results, rank = {}, 0
    for run in runs:
        rank, results[run["tag"]] = fit(out, run)
    results["float8_by_hand"] = {"losses": float8_by_hand()}
    write_json(os.path.join(out, f"h5_rank{rank}.json"), results)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
