"""One torchrun "node" of the elastic test: FSDP over however many nodes the rendezvous admitted.

Usage (per node): ``torchrun --nnodes=1:2 --nproc-per-node=1 --rdzv-backend=c10d ... elastic_train.py OUT``.

Every attempt calls ``fit(ckpt_path="last")``: the first finds nothing and starts fresh, a restarted
one resumes the newest checkpoint on the world size it now has. In the first attempt the rank on the node
started with ``ELASTIC_LOSE_THIS_NODE=1`` stops after the step-3 checkpoint (writes ``OUT/ready`` and waits to be killed with its
node); its peer's next collective then fails, and torchrun restarts the survivor on one node.
Rank 0 appends ``attempt world_size start_step unix_time`` to ``OUT/attempts.txt`` and writes the final
weights to ``OUT/final.json``.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
from rel_common import Net, to_lists, train_loader, write_json

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.strategies import FSDPStrategy

OUT = sys.argv[1]
CHECKPOINT_STEP = 3
MOMENTUM = 0.9  # optimizer state that must survive the reshard


class ElasticNet(Net):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=MOMENTUM)

    def on_train_start(self) -> None:
        if self.trainer.global_rank == 0:
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            with open(os.path.join(OUT, "attempts.txt"), "a", encoding="utf-8") as handle:
                handle.write(f"{attempt} {self.trainer.world_size} {self.trainer.global_step} {time.time():.3f}\n")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        doomed = os.environ.get("ELASTIC_LOSE_THIS_NODE") == "1"  # set by the test on the node it kills
        if first_attempt and doomed and self.trainer.global_step == CHECKPOINT_STEP:
            open(os.path.join(OUT, "ready"), "w").close()  # the step-3 checkpoint is published by now
            time.sleep(300)  # until the test kills this node


def main() -> None:
    world = int(os.environ["WORLD_SIZE"])
    trainer = Trainer(
        accelerator="cpu",
        strategy=FSDPStrategy(timeout=timedelta(seconds=15)),
        devices=1,
        num_nodes=world,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=OUT,
        callbacks=[ModelCheckpoint(os.path.join(OUT, "ckpt"), every_n_train_steps=CHECKPOINT_STEP, save_top_k=-1)],
    )
    model = ElasticNet()
    trainer.fit(model, train_loader(), ckpt_path="last")
    weights = to_lists(model.state_dict())  # collective under fsdp: every rank
    if trainer.is_global_zero:
        write_json(os.path.join(OUT, "final.json"), {"weights": weights, "global_step": trainer.global_step})


if __name__ == "__main__":
    main()
