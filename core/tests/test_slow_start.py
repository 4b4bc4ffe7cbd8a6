"""A rank that starts late does not fail the job when the strategy's timeout is short.

The timeout of ``ParallelStrategy(timeout=...)`` is for collectives (a short one catches a hang
fast); the ranks first meet with a start-up allowance of their own (``STARTUP_TIMEOUT``), so a
rank still importing torch on a loaded machine is waited for. The test runs this file as a script
(``python test_slow_start.py OUT``): rank 1 sleeps longer than the 2 s timeout before building its
Trainer, and the fit must still succeed on both ranks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from trainer_helpers import Net, loader, quiet

from phalanx.testing.processes import Job
from phalanx.trainer.trainer import Trainer

#: Holds wall-clock bounds: under xdist it runs with the machine to itself (phalanx.testing.scheduling).
pytestmark = pytest.mark.timing

#: Seconds rank 1 sleeps before it reaches the rendezvous: well past the strategy's timeout.
LATE = 6.0
TIMEOUT = timedelta(seconds=2)


@pytest.mark.timeout(150)
def test_a_late_rank_is_waited_for_beyond_the_collective_timeout(tmp_path: Path) -> None:
    job = Job([sys.executable, __file__, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=120)
    assert code == 0, job.output()
    assert job.leftovers() == [], job.output()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["global_step"] for r in ranks] == [5, 5], ranks
    assert ranks[1]["slept"] >= LATE, ranks


def _rank_main(out: str) -> None:
    from phalanx.strategies import ParallelStrategy

    slept = 0.0
    if os.environ.get("LOCAL_RANK") == "1":  # set for the re-run rank by the launcher
        time.sleep(LATE)
        slept = LATE
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ParallelStrategy(timeout=TIMEOUT),
        max_epochs=1,
        default_root_dir=out,
        **quiet(enable_model_summary=False),
    )
    trainer.fit(Net(), loader(n=20, batch_size=2))
    record = {"global_step": trainer.global_step, "slept": slept}
    (Path(out) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _rank_main(sys.argv[1])
