"""Several FSDPStrategy fits in the same 2 processes; the tests run this file in a subprocess.

``python variants.py OUT RUNS_JSON``; each run is a dict with ``tag`` and optional ``strategy``
(FSDPStrategy kwargs; ``auto_wrap_policy`` "Block" = the class set {Block}, "ModuleWrapPolicy" =
torch's ``ModuleWrapPolicy({Block})``), ``precision``, ``clip`` ([value, algorithm]), ``epochs``,
``resume`` (a path in OUT), ``model`` ("TwoOptimizers", "SGDMomentum"), ``expect_error``
(record the error fit raises instead of training), ``accumulate`` (default 2). Each rank writes ``OUT/variants_rank<r>.json``:
per tag the losses, the dtype the model computed in, which modules were sharded, the error.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from common import Block, Net, write_json
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import phalanx
from phalanx_strategy_fsdp import FSDPStrategy


class Recorded(Net):
    """Net that also records the dtype its output was computed in and which modules were sharded."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self.net(x)
        self.compute_dtype = str(out.dtype)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        self.losses.append(float(loss.detach()))
        return loss

    def on_train_end(self) -> None:
        self.sharded = sorted(name for name, m in self.named_modules() if type(m).__name__.startswith("FSDP"))


class TwoOptimizers(Recorded):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False  # two optimizers need manual optimization

    def configure_optimizers(self) -> Any:
        params = list(self.parameters())
        return [torch.optim.AdamW(params[:2]), torch.optim.AdamW(params[2:])]


class SGDMomentum(Recorded):
    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


MODELS = {"Recorded": Recorded, "TwoOptimizers": TwoOptimizers, "SGDMomentum": SGDMomentum}


def _strategy(kwargs: dict[str, Any]) -> FSDPStrategy:
    policy = kwargs.get("auto_wrap_policy")
    if policy == "Block":
        kwargs["auto_wrap_policy"] = {Block}
    elif policy == "ModuleWrapPolicy":
        kwargs["auto_wrap_policy"] = ModuleWrapPolicy({Block})
    return FSDPStrategy(**kwargs)


def fit(out: str, run: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    clip_val, clip_algorithm = run.get("clip", [0.5, "norm"])
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=_strategy(dict(run.get("strategy", {}))),
        precision=run.get("precision", "32-true"),
        max_epochs=run.get("epochs", 2),
        accumulate_grad_batches=run.get("accumulate", 2),
        gradient_clip_val=clip_val,
        gradient_clip_algorithm=clip_algorithm,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=out,
    )
    model = MODELS[run.get("model", "Recorded")]()
    resume = os.path.join(out, run["resume"]) if run.get("resume") else None
    if run.get("expect_error"):
        try:
            trainer.fit(model, ckpt_path=resume)
        except (Exception, CheckpointException) as error:  # DCP's CheckpointException is a BaseException
            return trainer.global_rank, {"error": f"{type(error).__name__}: {error}"}
        return trainer.global_rank, {"error": None}
    trainer.fit(model, ckpt_path=resume)
    return trainer.global_rank, {
        "losses": model.losses,
        "compute_dtype": model.compute_dtype,
        "sharded": model.sharded,
        "global_step": trainer.global_step,
        "direct_step": trainer.fit_loop.uses_direct_step,
    }


def main(out: str, runs: list[dict[str, Any]]) -> None:
    results, rank = {}, 0
    for run in runs:
        rank, results[run["tag"]] = fit(out, run)
    write_json(os.path.join(out, f"variants_rank{rank}.json"), results)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
