"""Train 12 steps (two epochs of 6) slowly enough for a test to send a signal mid-epoch, or resume.

Usage: ``python preempt.py run|resume STRATEGY OUT [slurm]``.

``run``: every rank writes ``OUT/pid<R>``; rank 0 writes ``OUT/step<N>`` after optimizer step N.
``resume``: ``fit(ckpt_path="last")`` to step 12, then an uninterrupted 12-step fit in the same
processes; rank 0 writes both final weights to ``OUT/resumed.json``. ``slurm``: the cluster environment is
``SLURMEnvironment(auto_requeue=True)`` (the test starts the tasks like srun does).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rel_common import Net, to_lists, train_loader, trainer_kwargs, write_json

from phalanx import Trainer
from phalanx.environments import SLURMEnvironment

OUT = sys.argv[3]


class SlowNet(Net):
    def on_train_start(self) -> None:
        with open(os.path.join(OUT, f"pid{self.trainer.global_rank}"), "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if sys.argv[1] == "run":
            if self.trainer.global_rank == 0:
                open(os.path.join(OUT, f"step{self.trainer.global_step}"), "w").close()
            time.sleep(0.15)


def main() -> None:
    mode, strategy = sys.argv[1], sys.argv[2]
    plugins = [SLURMEnvironment(auto_requeue=True)] if "slurm" in sys.argv[4:] else None
    trainer = Trainer(**trainer_kwargs(strategy, OUT, max_steps=12, max_epochs=None, plugins=plugins))
    model = SlowNet()
    trainer.fit(model, train_loader(), ckpt_path="last" if mode == "resume" else None)
    weights = to_lists(model.state_dict())
    if mode == "resume":  # and the run that never stopped, in the same processes
        straight = SlowNet()
        Trainer(**trainer_kwargs(strategy, os.path.join(OUT, "straight"), max_steps=12, max_epochs=None)).fit(
            straight, train_loader()
        )
        straight_weights = to_lists(straight.state_dict())  # collective under fsdp: every rank
        if trainer.is_global_zero:
            payload = {"weights": weights, "straight": straight_weights, "global_step": trainer.global_step}
            write_json(os.path.join(OUT, "resumed.json"), payload)


if __name__ == "__main__":
    main()
