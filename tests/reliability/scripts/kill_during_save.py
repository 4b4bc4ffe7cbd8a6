"""A run whose second checkpoint save stalls mid-write, so a test can ``kill -9`` the writer there.

Usage: ``python kill_during_save.py train|resume STRATEGY OUT [async]``.

``train``: 6 steps, ``last.ckpt`` written every 2 steps. The save at step 4 carries an object whose
pickling announces itself (``OUT/saving``) and then sleeps, so rank 0 is killed in the middle of
writing the file (or, for sharded strategies, after its shards and before the directory is
complete). ``resume``: ``fit(ckpt_path="last")`` to step 6; rank 0 writes ``OUT/resumed.json``
with the checkpoint it started from and the final weights.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rel_common import Net, to_lists, train_loader, trainer_kwargs, write_json

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.checkpoint_io import AsyncCheckpointIO

OUT = sys.argv[3]


class Stall:
    """Pickled inside the checkpoint: says the write has started, then blocks the writer."""

    def __reduce__(self) -> Any:
        with open(os.path.join(OUT, "saving"), "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))
        time.sleep(120)
        return (int, (0,))


class StallingNet(Net):
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if checkpoint["global_step"] == 4 and sys.argv[1] == "train":
            checkpoint["stall"] = Stall()


def main() -> None:
    mode, strategy = sys.argv[1], sys.argv[2]
    saver = ModelCheckpoint(dirpath=os.path.join(OUT, "ckpts"), save_top_k=0, save_last=True, every_n_train_steps=2)
    plugins = [AsyncCheckpointIO()] if "async" in sys.argv[4:] else None
    kwargs = trainer_kwargs(strategy, OUT, max_steps=6, callbacks=[saver], enable_checkpointing=True, plugins=plugins)
    trainer = Trainer(**kwargs)
    model = StallingNet()
    trainer.fit(model, train_loader(), ckpt_path="last" if mode == "resume" else None)
    weights = to_lists(model.state_dict())
    if mode == "resume" and trainer.is_global_zero:
        write_json(os.path.join(OUT, "resumed.json"), {"weights": weights, "global_step": trainer.global_step})


if __name__ == "__main__":
    main()
