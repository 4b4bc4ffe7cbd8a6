"""A rank that stops taking part ends the job within the strategy's timeout, naming that rank."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from phalanx.testing.processes import Job

SCRIPT = Path(__file__).parent / "scripts" / "hang.py"
pytestmark = [pytest.mark.timeout(120), pytest.mark.timing]


def test_a_stuck_rank_fails_the_job_within_the_timeout_and_is_named(tmp_path: Path) -> None:
    job = Job([sys.executable, str(SCRIPT), "3"], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    started = time.monotonic()
    code = job.wait(timeout=90)
    elapsed = time.monotonic() - started
    output = job.output()
    assert code != 0, output
    assert "Timed out" in output, output
    assert "rank 0 waited 3 s in backward() for rank(s) 1, which did not arrive" in output, output
    assert job.leftovers() == [], output
    # start-up (two torch imports on a loaded machine) + 3 s timeout + 2 s check-in + stopping: far from 300 s
    assert elapsed < 80, f"the job took {elapsed:.1f} s to fail"
