"""Train ``TinyLM`` under context parallel / HSDP meshes; optionally plain FSDP on the same ranks.

``python train_cp.py OUT CONFIG_JSON``; CONFIG is a list of runs done in order by every rank, each
a dict: ``tag``, ``devices``, sizes ``dp``/``rep``/``shard``/``cp``/``tp``, ``model`` (a key of
MODELS), ``epochs``, ``expect_error`` (record the message) and ``reference_fsdp`` (after the fit,
plain ``fully_shard`` over all ranks, per-step global losses). Each rank writes
``OUT/<tag>_rank<r>.json``; rank 0 writes the gathered weights to ``OUT/<tag>_weights.pt``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from cp_common import GLOBAL_BATCH, SEQ, TinyLM, loader, loss_fn, make_optimizer, tp_plan
from mp_common import write_json
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module
from torch.utils.data import DataLoader, DistributedSampler

import phalanx
from phalanx_strategy_model_parallel import ModelParallelStrategy


def _world_mean(value: torch.Tensor) -> float:
    """Mean over all ranks: tp peers hold equal values, so this is the mean over dp x cp ranks."""
    value = value.detach().float().clone()
    dist.all_reduce(value)
    return float(value) / dist.get_world_size()


class AutoLM(phalanx.Module):
    """No configure_model: the strategy shards the whole Module over its fsdp_mesh."""

    attention = "sdpa"

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.global_losses: list[float] = []
        self.net = TinyLM(self.attention)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        tokens, targets = batch
        loss = loss_fn(self.net(tokens), targets)
        self.losses.append(float(loss.detach()))
        self.global_losses.append(_world_mean(loss))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.parameters())

    def train_dataloader(self) -> Any:
        return loader(self.trainer.strategy.data_parallel_size)


class ManualAttentionLM(AutoLM):
    attention = "manual"


class MultiheadAttentionLM(AutoLM):
    attention = "mha"


class ShardedLM(AutoLM):
    """Tensor parallel per block when tp > 1, then fully_shard per block and root over fsdp_mesh."""

    def __init__(self) -> None:
        phalanx.Module.__init__(self)
        self.losses, self.global_losses = [], []

    def _fsdp_mesh(self) -> Any:
        return self.trainer.strategy.fsdp_mesh

    def configure_model(self) -> None:
        if hasattr(self, "net"):
            return
        self.net = TinyLM()
        if self.device_mesh["tensor_parallel"].size() > 1:
            for block in self.net.blocks:
                parallelize_module(block, self.device_mesh["tensor_parallel"], tp_plan())
        for block in self.net.blocks:
            fully_shard(block, mesh=self._fsdp_mesh())
        fully_shard(self.net, mesh=self._fsdp_mesh())


class WrongMeshLM(ShardedLM):
    """Shards over data_parallel only: cp ranks' gradients would never be averaged."""

    def _fsdp_mesh(self) -> Any:
        return self.device_mesh["data_parallel"]


MODELS = {
    "auto": AutoLM,
    "manual": ManualAttentionLM,
    "mha": MultiheadAttentionLM,
    "sharded": ShardedLM,
    "wrongmesh": WrongMeshLM,
}


def reference_fsdp(epochs: int) -> list[float]:
    """Plain torch: fully_shard over all ranks (1-D mesh), DistributedSampler; global per-step losses."""
    world = dist.get_world_size()
    net = TinyLM()
    mesh = init_device_mesh("cpu", (world,))
    for block in net.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = make_optimizer(net.parameters())
    data = loader(1).dataset
    sampler = DistributedSampler(data, num_replicas=world, rank=dist.get_rank(), shuffle=False)
    batches = DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for tokens, targets in batches:
            loss = loss_fn(net(tokens), targets)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(_world_mean(loss))
    return losses


def one_run(out: str, run: dict[str, Any]) -> None:
    strategy = ModelParallelStrategy(
        data_parallel_size=run.get("dp", "auto"),
        tensor_parallel_size=run.get("tp", 1),
        context_parallel_size=run.get("cp", 1),
        data_parallel_replicate_size=run.get("rep", 1),
        data_parallel_shard_size=run.get("shard"),
    )
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=run["devices"],
        strategy=strategy,
        max_epochs=run.get("epochs", 2),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=out,
    )
    model = MODELS[run.get("model", "sharded")]()
    result: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        trainer.fit(model)
    except Exception as error:
        if not run.get("expect_error"):
            raise
        result.update(error=f"{type(error).__name__}: {error}", steps_done=len(model.losses))
        write_json(os.path.join(out, f"{run['tag']}_rank{dist.get_rank()}.json"), result)
        return
    param = next(p for p in model.parameters() if isinstance(p, DTensor))
    result.update(
        seconds=time.perf_counter() - start,
        losses=model.losses,
        global_losses=model.global_losses,
        global_step=trainer.global_step,
        coords=strategy.layout.coordinates(trainer.global_rank),
        mesh_dims=list(param.device_mesh.mesh_dim_names or ()),
        placements=[str(p) for p in param.placements],
        all_mesh_dims=sorted({"/".join(p.device_mesh.mesh_dim_names or ()) for p in model.parameters()}),
        seq_len_seen=SEQ // strategy.context_parallel_size,
    )
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if trainer.global_rank == 0:
        torch.save(
            {k: v.detach().float().cpu() for k, v in full.items()}, os.path.join(out, f"{run['tag']}_weights.pt")
        )
    if run.get("reference_fsdp"):
        result["reference_losses"] = reference_fsdp(run.get("epochs", 2))
    write_json(os.path.join(out, f"{run['tag']}_rank{trainer.global_rank}.json"), result)


def main(out: str, runs: list[dict[str, Any]]) -> None:
    for run in runs:
        one_run(out, run)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
