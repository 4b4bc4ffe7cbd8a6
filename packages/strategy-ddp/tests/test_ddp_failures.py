"""When one rank fails, the whole job stops fast, says which rank failed once, and leaves nothing.

Rank 1 raises at its 4th step while rank 0 waits for it inside DDP's gradient all-reduce: the
realistic failure. The job must exit non-zero within 3 s of the raise, print the traceback once
with the rank prefix, and leave no process behind. Ctrl-C (SIGINT to the whole process group, as a
terminal sends it) must stop every process too. All jobs run at once (module fixture): most of
their time is importing torch, which overlaps.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from ddp_helpers import start_job

from phalanx.testing.processes import Job

pytestmark = pytest.mark.timeout(240)

_DEADLINE_SECONDS = 3.0
_FAILING = ("ddp", "ddp_spawn", "ddp_fork")
_INTERRUPTED = ("ddp_fork",)  # ddp's launcher is interrupted in core/tests/test_launchers.py


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    tmp = tmp_path_factory.mktemp("failures")
    started = {f"raise-{s}": start_job(tmp, f"raise-{s}", "fail.py", s, "1", "raise") for s in _FAILING}
    pending = {f"ctrlc-{s}": start_job(tmp, f"ctrlc-{s}", "fail.py", s, "-1", "hang") for s in _INTERRUPTED}
    started.update(pending)
    deadline = time.monotonic() + 200
    # Poll every job in one loop, so each one's end time is seen within 20 ms.
    while None in [job.poll() for job in started.values()] and time.monotonic() < deadline:
        for name, job in list(pending.items()):
            if job.stdout.count("READY") >= 2 or job.poll() is not None:
                job.interrupted_at = time.time()  # type: ignore[attr-defined]
                if job.poll() is None:
                    job.signal_group(signal.SIGINT)
                del pending[name]
        time.sleep(0.02)
    for job in started.values():
        job.wait(1)
    return started


@pytest.mark.parametrize("strategy", _FAILING)
def test_failing_rank_stops_the_whole_job_within_3s(jobs: dict[str, Job], strategy: str) -> None:
    job = jobs[f"raise-{strategy}"]
    assert job.process.returncode != 0, job.output()
    raised = re.search(r"RAISING (\d+\.\d+)", job.stdout)
    assert raised, job.output()
    assert job.ended is not None
    assert job.ended - float(raised.group(1)) < _DEADLINE_SECONDS, job.output()
    stderr = job.stderr
    assert stderr.count("ValueError: boom from rank 1") == 1, stderr  # printed once ...
    assert "[rank 1] ValueError: boom from rank 1" in stderr  # ... with its rank
    assert "[rank 0] Traceback" not in stderr  # the rank that was stopped adds no noise
    assert not job.leftovers()


@pytest.mark.parametrize("strategy", _INTERRUPTED)
def test_ctrl_c_stops_every_process(jobs: dict[str, Job], strategy: str) -> None:
    job = jobs[f"ctrlc-{strategy}"]
    assert job.stdout.count("READY") == 2, job.output()
    assert job.process.returncode == 130, job.output()
    assert job.ended is not None and job.ended - job.interrupted_at < _DEADLINE_SECONDS  # type: ignore[attr-defined]
    assert "Traceback" not in job.stderr, job.stderr
    assert not job.leftovers()
