"""phalanx_ray.fit under ddp with a worker killed mid-fit: Ray restarts the group, which resumes.

Usage: ``python ray_restart.py OUT`` with RAY_ADDRESS naming the test's cluster. Checkpoints every
2 steps; on the first attempt rank 1 stops before step 7 and writes OUT/worker.pid for the test to
kill it. Writes OUT/final.pt (rank 0's final weights, by ray_modules.Journal), OUT/starts_rank*.txt
(the checkpoint each attempt resumed from) and OUT/result.json.
"""

from __future__ import annotations

import json
import os
import sys

import ray
from ray_case import STEPS
from ray_modules import Journal, KillPoint, Net, train_loader

import phalanx_ray
from phalanx.callbacks import ModelCheckpoint


def main(out: str) -> None:
    ray.init()
    checkpoints = ModelCheckpoint(dirpath=os.path.join(out, "checkpoints"), every_n_train_steps=2, save_last=True)
    trainer_kwargs = {
        "strategy": "ddp",
        "accelerator": "cpu",
        "max_steps": STEPS,
        "logger": False,
        "enable_progress_bar": False,
        "default_root_dir": out,
        "callbacks": [checkpoints, KillPoint(out, at_step=7), Journal(out)],
    }
    result = phalanx_ray.fit(
        Net,
        train_loader,
        trainer_kwargs,
        num_workers=2,
        max_failures=1,
        storage_path=os.path.join(out, "ray_results"),
        name="restart",
    )
    with open(os.path.join(out, "result.json"), "w") as handle:
        json.dump({"checkpoint": phalanx_ray.checkpoint_path(result.checkpoint), "metrics": result.metrics}, handle)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
