"""Train ``Net`` with ModelParallelStrategy, then the plain-torch reference on the same ranks.

``python train.py OUT CONFIG_JSON``; CONFIG is a list of runs done in order by every rank, each a
dict: ``tag``, ``dp``/``tp``/``pp`` sizes, ``schedule``, ``micro`` (num_microbatches),
``precision``, ``epochs``, ``batches`` (limit_train_batches), ``accumulate``
(accumulate_grad_batches), ``checkpoint`` (activation checkpointing of every ``MLP`` block),
``resume`` (a path), ``save_epoch0`` (checkpoint name after epoch 0), ``save_final_full`` (consolidated file
name after fit), ``reference`` ("tp" or "pp": the plain torch run on a fresh mesh of the same
shape), ``validate``/``predict``, ``model`` (a Net variant) and ``expect_error`` (run must raise;
its message is recorded). Each rank writes ``OUT/<tag>_rank<r>.json``; ranks at dp = tp = 0 also
write their full (gathered) weights to ``OUT/<tag>_weights_rank<r>.pt``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from mp_common import (
    MLP,
    dp_mean,
    loader,
    loss_fn,
    make_net,
    make_optimizer,
    parallelize,
    pipeline_stages,
    reference_pipeline,
    reference_tensor_parallel,
    write_json,
)
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh

import phalanx
from phalanx.callbacks import Callback
from phalanx_strategy_model_parallel import ModelParallelStrategy


class Net(phalanx.Module):
    def __init__(self, hidden: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.hidden = hidden
        self.depth = depth
        self.losses: list[float] = []
        self.global_losses: list[float] = []
        self.val_losses: list[float] = []

    @property
    def pipelined(self) -> bool:
        return self.trainer.strategy.pipeline_parallel_size > 1

    def configure_model(self) -> None:
        if hasattr(self, "net"):
            return
        self.net = make_net(self.hidden, self.depth)
        if not self.pipelined:
            parallelize(self.net, self.device_mesh)

    def pipeline_stages(self) -> list[nn.Module]:
        return pipeline_stages(self.net)

    def _loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        if self.pipelined:
            return self.trainer.strategy.run_pipeline(x, target=y, loss_fn=loss_fn)
        return loss_fn(self.net(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.losses.append(float(loss.detach()))
        self.global_losses.append(dp_mean(loss, self.device_mesh))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_losses.append(float(self._loss(batch)))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        return self.trainer.strategy.run_pipeline(x) if self.pipelined else self.net(x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.parameters())

    def train_dataloader(self) -> Any:
        return loader(self.trainer.strategy.data_parallel_size)


class Blocks(Net):
    """Every layer a block: the strategy groups them into the schedule's stages."""

    def pipeline_stages(self) -> list[nn.Module]:
        return list(self.net)


class NoStages(Net):
    pipeline_stages = None  # type: ignore[assignment]


class Uncovered(Net):
    def pipeline_stages(self) -> list[nn.Module]:
        return [nn.Sequential(self.net[0]), nn.Sequential(self.net[1])]  # the head is in no stage


class NoConfigureModel(phalanx.Module):
    """Trainable, but never parallelized: the strategy must refuse it."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return loss_fn(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.parameters())

    def train_dataloader(self) -> Any:
        return loader(1)


MODELS = {"Net": Net, "Net32": lambda: Net(32), "Net15": lambda: Net(15), "NoStages": NoStages,
          "Uncovered": Uncovered, "NoConfigureModel": NoConfigureModel, "Blocks3": lambda: Blocks(depth=2),
          "Blocks4": lambda: Blocks(depth=3), "Blocks5": lambda: Blocks(depth=4)}


class SaveEpoch0(Callback):
    def __init__(self, path: str | None) -> None:
        self.path = path

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.path and trainer.current_epoch == 0:
            trainer.save_checkpoint(self.path)


def one_run(out: str, run: dict[str, Any]) -> None:
    strategy = ModelParallelStrategy(
        data_parallel_size=run.get("dp", "auto"),
        tensor_parallel_size=run.get("tp", "auto"),
        pipeline_parallel_size=run.get("pp", 1),
        pipeline_schedule=run.get("schedule", "1f1b"),
        num_microbatches=run.get("micro"),
        activation_checkpointing_policy={MLP} if run.get("checkpoint") else None,
    )
    save0 = os.path.join(out, run["save_epoch0"]) if run.get("save_epoch0") else None
    trainer = phalanx.Trainer(
        accelerator="cpu", devices=run.get("devices", 4), strategy=strategy, precision=run.get("precision", "32-true"),
        max_epochs=run.get("epochs", 2), logger=False, enable_checkpointing=False, enable_progress_bar=False,
        callbacks=[SaveEpoch0(save0)], default_root_dir=out, limit_val_batches=2,
        limit_train_batches=run.get("batches"), accumulate_grad_batches=run.get("accumulate", 1),
    )
    model = MODELS[run.get("model", "Net")]()
    MLP.forward_calls = 0
    result: dict[str, Any] = {}
    val = loader(1) if run.get("validate") else None
    try:
        trainer.fit(model, val_dataloaders=val, ckpt_path=run.get("resume"))
    except Exception as error:
        if not run.get("expect_error"):
            raise
        result["error"] = f"{type(error).__name__}: {error}"
        write_json(os.path.join(out, f"{run['tag']}_rank{dist.get_rank()}.json"), result)
        return
    rank = trainer.global_rank
    coords = strategy.layout.coordinates(rank)
    result.update(losses=model.losses, global_losses=model.global_losses, val_losses=model.val_losses,
                  global_step=trainer.global_step, coords=coords,
                  param_dtype=str(next(model.parameters()).dtype))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if coords["data_parallel"] == 0 and coords["tensor_parallel"] == 0:
        torch.save({k: v.detach().float().cpu() for k, v in full.items()}, os.path.join(out, f"{run['tag']}_weights_rank{rank}.pt"))
    if run.get("save_final_full"):
        strategy.save_distributed_checkpoint = False
        trainer.save_checkpoint(os.path.join(out, run["save_final_full"]))
    if run.get("save_final"):
        trainer.save_checkpoint(os.path.join(out, run["save_final"]))
    if run.get("predict"):
        predictions = trainer.predict(model, dataloaders=loader(1), return_predictions=True)
        result["predictions"] = [p.flatten().tolist() for p in predictions][:2]
    result["mlp_forward_calls"] = MLP.forward_calls
    reference = run.get("reference")
    if reference:
        layout = strategy.layout
        mesh = init_device_mesh("cpu", layout.shape, mesh_dim_names=layout.dim_names)
        if reference == "tp":
            result["reference_losses"] = reference_tensor_parallel(mesh, run.get("epochs", 2), run.get("precision", "32-true"))
        else:
            micro = run.get("micro") or 2 * layout.pipeline_parallel
            result["reference_losses"] = reference_pipeline(mesh, run.get("epochs", 2), run.get("schedule", "1f1b"), micro)
    write_json(os.path.join(out, f"{run['tag']}_rank{rank}.json"), result)


def main(out: str, runs: list[dict[str, Any]]) -> None:
    for run in runs:
        one_run(out, run)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
