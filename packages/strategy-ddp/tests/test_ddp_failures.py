"""When one rank fails, the whole job stops fast, says which rank failed once, and leaves nothing.

Rank 1 raises at its 4th step while rank 0 waits for it inside DDP's gradient all-reduce: the
realistic failure. The job must exit non-zero within 3 s of the raise, print the traceback once
with the rank prefix, and leave no process behind. Ctrl-C (SIGINT to the whole process group, as a
terminal sends it) must stop every process too.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
from ddp_helpers import start_job

pytestmark = pytest.mark.timeout(180)

_DEADLINE_SECONDS = 3.0


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "ddp_fork"])
def test_failing_rank_stops_the_whole_job_within_3s(tmp_path: Path, strategy: str) -> None:
    job = start_job(tmp_path, strategy, "fail.py", strategy, "1", "raise")
    code = job.wait(150)
    assert code != 0, job.output()
    raised = re.search(r"RAISING (\d+\.\d+)", job.stdout)
    assert raised, job.output()
    assert job.ended is not None
    assert job.ended - float(raised.group(1)) < _DEADLINE_SECONDS, job.output()
    stderr = job.stderr
    assert stderr.count("ValueError: boom from rank 1") == 1, stderr  # printed once ...
    assert "[rank 1] ValueError: boom from rank 1" in stderr  # ... with its rank
    assert "[rank 0] Traceback" not in stderr  # the rank that was stopped adds no noise
    assert not job.leftovers()


@pytest.mark.parametrize("strategy", ["ddp", "ddp_fork"])
def test_ctrl_c_stops_every_process(tmp_path: Path, strategy: str) -> None:
    job = start_job(tmp_path, strategy, "fail.py", strategy, "-1", "hang")
    deadline = time.monotonic() + 150
    while job.stdout.count("READY") < 2:
        assert job.process.poll() is None, job.output()
        assert time.monotonic() < deadline, job.output()
        time.sleep(0.05)
    sent = time.time()
    job.signal_group(signal.SIGINT)
    code = job.wait(30)
    assert code == 130, job.output()
    assert job.ended is not None and job.ended - sent < _DEADLINE_SECONDS
    assert "Traceback" not in job.stderr, job.stderr
    assert not job.leftovers()
