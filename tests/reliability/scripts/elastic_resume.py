"""Save mid-epoch on one world size, resume on another (no torchrun: phalanx's own launcher).

Usage: ``python elastic_resume.py STRATEGY DEVICES OUT``. Every run calls ``fit(ckpt_path="last")``:
the first (no checkpoint yet) stops after step 3 and its ModelCheckpoint saves there, mid-epoch;
the next resumes that checkpoint on ``DEVICES`` ranks and finishes the epoch. Rank 0 writes the
final weights to ``OUT/final.json``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from rel_common import Net, to_lists, train_loader, write_json

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.strategies import ModelParallelStrategy

STRATEGY, DEVICES, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
CHECKPOINT_STEP = 3


class MomentumNet(Net):
    def configure_model(self) -> None:
        if STRATEGY == "model_parallel":  # FSDP2 over the data-parallel mesh: a DCP checkpoint
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.layers, mesh=self.device_mesh["data_parallel"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main() -> None:
    directory = os.path.join(OUT, "ckpt")
    first = not os.path.isdir(directory)
    strategy: Any = STRATEGY
    if STRATEGY == "model_parallel":
        strategy = ModelParallelStrategy(data_parallel_size=DEVICES, tensor_parallel_size=1)
    trainer = Trainer(
        accelerator="cpu",
        strategy=strategy,
        devices=DEVICES,
        max_epochs=1,
        max_steps=CHECKPOINT_STEP if first else -1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=OUT,
        callbacks=[ModelCheckpoint(directory, every_n_train_steps=CHECKPOINT_STEP, save_top_k=-1)],
    )
    model = MomentumNet()
    trainer.fit(model, train_loader(), ckpt_path="last")
    weights = to_lists(model.state_dict())  # collective under fsdp: every rank
    if trainer.is_global_zero:
        write_json(os.path.join(OUT, "final.json"), {"weights": weights, "global_step": trainer.global_step})


if __name__ == "__main__":
    main()
