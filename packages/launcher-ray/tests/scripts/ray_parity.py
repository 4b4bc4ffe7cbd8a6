"""One TorchTrainer run of 2 workers: the user's Trainer code under ddp, fsdp and local_sgd, unchanged.

Usage: ``python ray_parity.py OUT`` with RAY_ADDRESS naming the test's cluster. The training
function first builds a Trainer whose devices disagree with the 2 workers (and keeps the error),
then trains the same Module with each strategy by name, reporting checkpoints to Ray. Rank 0
writes OUT/ray_<strategy>.pt (the final weights, whole) and OUT/run.json (what each Trainer saw;
the error; the checkpoints Ray keeps for the run).
"""

from __future__ import annotations

import json
import os
import sys

import ray
import ray.train
import torch
from ray.train.torch import TorchTrainer
from ray_case import STEPS, full_state

STRATEGIES = ("ddp", "fsdp", "local_sgd")


def train_fn(config: dict) -> None:
    import torch.distributed as dist
    from ray_modules import Net

    from phalanx import Trainer
    from phalanx.callbacks import ModelCheckpoint
    from phalanx.errors import MisconfigurationError

    out = config["out"]
    seen: dict = {"ray_group_before": dist.is_initialized(), "master_addr": os.environ.get("MASTER_ADDR")}
    ray_group = dist.group.WORLD
    try:
        Trainer(strategy="ddp", accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
        seen["mismatch_error"] = None
    except MisconfigurationError as error:
        seen["mismatch_error"] = str(error)
    for name in STRATEGIES:
        module = Net()
        trainer = Trainer(
            strategy=name, accelerator="cpu", devices=2, max_steps=STEPS, logger=False, enable_progress_bar=False,
            default_root_dir=os.path.join(out, name),
            callbacks=[ModelCheckpoint(dirpath=os.path.join(out, name, "checkpoints"), every_n_train_steps=4,
                                       save_last=True), "ray_train_report"],
        )  # fmt: skip
        trainer.fit(module)
        state = full_state(module.layers)
        seen[name] = {
            "environment": type(trainer.strategy.cluster_environment).__name__,
            "world_size": trainer.world_size,
            "global_rank": trainer.global_rank,
            "rays_process_group": dist.is_initialized() and dist.group.WORLD is ray_group,
            "last": os.path.realpath(os.path.join(out, name, "checkpoints", "last.ckpt")),
        }
        if trainer.is_global_zero:
            torch.save(state, os.path.join(out, f"ray_{name}.pt"))
    if ray.train.get_context().get_world_rank() == 0:
        with open(os.path.join(out, "workers.json"), "w") as handle:
            json.dump(seen, handle)


def main(out: str) -> None:
    ray.init()
    trainer = TorchTrainer(
        train_fn,
        train_loop_config={"out": out},
        scaling_config=ray.train.ScalingConfig(num_workers=2),
        run_config=ray.train.RunConfig(storage_path=os.path.join(out, "ray_results"), name="parity"),
    )
    result = trainer.fit()
    kept = [
        {
            "path": checkpoint.path,
            "metrics": metrics,
            "entries": sorted(e for e in os.listdir(checkpoint.path) if e[0] != "."),
        }
        for checkpoint, metrics in result.best_checkpoints
    ]
    with open(os.path.join(out, "run.json"), "w") as handle:
        json.dump({"checkpoints": kept, "final": result.checkpoint.path, "metrics": result.metrics}, handle)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
