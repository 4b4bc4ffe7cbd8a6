"""Train ``MoENet`` with expert parallel; record losses, the experts each rank holds, the weights.

``python train_moe.py OUT CONFIG_JSON``; CONFIG is a list of runs done in order by every rank,
each a dict: ``tag``, ``devices``, ``dp``, ``ep`` (expert_parallel_size), ``tp``, ``cp``, ``rep``
(data_parallel_replicate_size, with ``dp`` then the shard size), ``epochs``, ``resume``
(a checkpoint name in OUT), ``save`` (a DCP checkpoint name written after fit), ``model`` (a key
of MODELS), ``clip`` (the Trainer's gradient_clip_val) and ``expect_error`` (the run must raise; its message is recorded). Each rank writes
``OUT/<tag>_rank<r>.json``; rank 0 writes the gathered weights to ``OUT/<tag>_weights.pt``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from moe_common import EXPERTS, MAX_NORM, MoENet, loader, loss_fn, make_optimizer
from mp_common import write_json
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

import phalanx
from phalanx_strategy_model_parallel import ExpertParallel, ModelParallelStrategy, clip_grad_norm_


class MoEModule(phalanx.Module):
    """Experts: ExpertParallel over expert_parallel, then FSDP over expert_fsdp_mesh; the rest over fsdp_mesh."""

    num_experts = EXPERTS
    expert_parallel = True
    stacked = False

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.global_losses: list[float] = []
        self.grad_norms: list[float] = []

    def configure_model(self) -> None:
        if hasattr(self, "net"):
            return
        self.net = MoENet(self.num_experts, stacked=self.stacked)
        strategy = self.trainer.strategy
        if strategy.expert_parallel_size > 1 and self.expert_parallel:
            parallelize_module(self.net.moe.experts, self.device_mesh["expert_parallel"], ExpertParallel())
        fully_shard(self.net.moe.experts, mesh=strategy.expert_fsdp_mesh)
        fully_shard(self.net, mesh=strategy.fsdp_mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = loss_fn(self.net, self.net(x), y)
        self.losses.append(float(loss.detach()))
        value = loss.detach().clone()
        dist.all_reduce(value)  # tp peers hold equal losses: the world mean is the mean over dp x cp ranks
        self.global_losses.append(float(value) / dist.get_world_size())
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.grad_norms.append(float(clip_grad_norm_(self.parameters(), MAX_NORM)))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.parameters())

    def train_dataloader(self) -> Any:
        return loader(self.trainer.strategy.data_parallel_size)


class ThreeExperts(MoEModule):
    num_experts = 3


class NoExpertParallel(MoEModule):
    expert_parallel = False


class StackedMoE(MoEModule):
    stacked = True


MODELS = {"moe": MoEModule, "three": ThreeExperts, "noep": NoExpertParallel, "stacked": StackedMoE}


def one_run(out: str, run: dict[str, Any]) -> None:
    dp: dict[str, Any] = {"data_parallel_size": run["dp"]}
    if run.get("rep"):
        dp = {"data_parallel_replicate_size": run["rep"], "data_parallel_shard_size": run["dp"]}
    strategy = ModelParallelStrategy(
        **dp,
        tensor_parallel_size=run.get("tp", 1),
        context_parallel_size=run.get("cp", 1),
        expert_parallel_size=run.get("ep", 1),
    )
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=run["devices"],
        strategy=strategy,
        max_epochs=run.get("epochs", 1),
        gradient_clip_val=run.get("clip"),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=out,
    )
    model = MODELS[run.get("model", "moe")]()
    resume = os.path.join(out, run["resume"]) if run.get("resume") else None
    result: dict[str, Any] = {}
    try:
        trainer.fit(model, ckpt_path=resume)
    except Exception as error:
        if not run.get("expect_error"):
            raise
        result["error"] = f"{type(error).__name__}: {error}"
        write_json(os.path.join(out, f"{run['tag']}_rank{dist.get_rank()}.json"), result)
        return
    w1 = next(model.net.moe.experts.parameters())
    result.update(
        losses=model.losses,
        global_losses=model.global_losses,
        grad_norms=model.grad_norms,
        global_step=trainer.global_step,
        coords=strategy.layout.coordinates(trainer.global_rank),
        expert_mesh=list(w1.device_mesh.mesh_dim_names or ()) if isinstance(w1, DTensor) else [],
        local_experts=int(w1.to_local().shape[0]) if isinstance(w1, DTensor) else int(w1.shape[0]),
    )
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if trainer.is_global_zero:
        torch.save({k: v.detach().cpu() for k, v in full.items()}, os.path.join(out, f"{run['tag']}_weights.pt"))
    if run.get("save"):
        trainer.save_checkpoint(os.path.join(out, run["save"]))
    write_json(os.path.join(out, f"{run['tag']}_rank{trainer.global_rank}.json"), result)


def main(out: str, runs: list[dict[str, Any]]) -> None:
    for run in runs:
        one_run(out, run)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
