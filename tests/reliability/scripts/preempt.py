"""Train 12 steps (two epochs of 6) with a signal sent mid-epoch, or resume.

Usage: ``python preempt.py run|resume STRATEGY OUT [slurm]``.

``run``: every rank writes ``OUT/pid<R>``; rank 0 writes ``OUT/step<N>`` after optimizer step N. The
ranks named in ``PREEMPT_SIGNALLED_RANKS`` (comma-separated; ranks the test's signal surely reaches)
wait after step 3 until their preemption handler has seen it (up to 60 s), so the step the ranks stop
after does not depend on how fast the machine is: the signal is in by step 3's check, the agreement
is read at the next one.
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
SIGNALLED = os.environ.get("PREEMPT_SIGNALLED_RANKS", "").split(",")


class SlowNet(Net):
    def on_train_start(self) -> None:
        with open(os.path.join(OUT, f"pid{self.trainer.global_rank}"), "w", encoding="utf-8") as handle:
            handle.write(str(os.getpid()))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if sys.argv[1] != "run":
            return
        if self.trainer.global_rank == 0:
            open(os.path.join(OUT, f"step{self.trainer.global_step}"), "w").close()
        if self.trainer.global_step == 3 and str(self.trainer.global_rank) in SIGNALLED:
            preemption = self.trainer.fit_loop.preemption
            deadline = time.monotonic() + 60
            while preemption.requested is None and time.monotonic() < deadline:
                time.sleep(0.01)  # the handler runs between these sleeps


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
