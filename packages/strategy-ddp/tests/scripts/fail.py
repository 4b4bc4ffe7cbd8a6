"""A 2-rank run in which one rank raises mid-training while the other waits in a collective.

Usage: python fail.py STRATEGY FAIL_RANK MODE
MODE "raise": rank FAIL_RANK raises ValueError at its 4th training step (printing RAISING <time>
first). MODE "stubborn": the same, while every other rank sleeps outside any collective with SIGTERM
ignored (only SIGKILL stops it).
MODE "hang": every rank prints READY and then keeps training slowly, for Ctrl-C and kill -9 tests.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import torch
from common import PhalanxNet, loader, trainer_kwargs

import phalanx


class Failing(PhalanxNet):
    def __init__(self, fail_rank: int, mode: str) -> None:
        super().__init__()
        self.fail_rank, self.mode = fail_rank, mode

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        rank = self.trainer.global_rank
        if self.mode == "stubborn" and rank != self.fail_rank and batch_idx == 3:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(120)
        if self.mode == "hang":
            if batch_idx == 0:
                print(f"READY {rank}", flush=True)
            time.sleep(0.05)
        elif rank == self.fail_rank and batch_idx == 3 and self.mode in ("raise", "stubborn"):
            print(f"RAISING {time.time()}", flush=True)
            msg = f"boom from rank {rank}"
            raise ValueError(msg)
        return super().training_step(batch, batch_idx)


if __name__ == "__main__":
    strategy, fail_rank, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.manual_seed(0)
    trainer = phalanx.Trainer(**trainer_kwargs(devices=2, strategy=strategy, max_epochs=1000))
    trainer.fit(Failing(fail_rank, mode), loader())
