"""A run killed (SIGKILL, every rank) while an asynchronous sharded save is being written.

``python async_kill.py OUT``: FSDPStrategy on 2 ranks saves every epoch (an epoch checkpoint plus
"last") through ``AsyncCheckpointIO``. The 4th background save, epoch 1's "last", is the one in
flight when rank 0 kills the whole process group: the shards are being written by DCP's thread and
nothing is published yet. ``OUT/ckpts/last.ckpt`` must still be epoch 0's complete checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from common import Block, Net

import phalanx
from phalanx.callbacks import ModelCheckpoint
from phalanx.checkpoint_io import AsyncCheckpointIO
from phalanx_strategy_fsdp import FSDPStrategy

KILL_AT = 4


class KilledDuringWrite(AsyncCheckpointIO):
    """Kill every rank at the moment the ``KILL_AT``-th background save has started writing."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def run_in_background(self, function: Callable[[], None]) -> None:
        self.started += 1
        if self.started == KILL_AT:
            if os.environ.get("LOCAL_RANK", "0") == "0":
                os.killpg(os.getpgid(0), signal.SIGKILL)
            signal.pause()  # the other rank waits to be killed with the group
        super().run_in_background(function)


def main(out: str) -> None:
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=FSDPStrategy(auto_wrap_policy={Block}),
        plugins=[KilledDuringWrite()],
        max_epochs=2,
        accumulate_grad_batches=2,
        gradient_clip_val=0.5,
        logger=False,
        enable_progress_bar=False,
        callbacks=[ModelCheckpoint(dirpath=os.path.join(out, "ckpts"), save_last=True, save_top_k=-1)],
        default_root_dir=out,
    )
    trainer.fit(Net())


if __name__ == "__main__":
    main(sys.argv[1])
