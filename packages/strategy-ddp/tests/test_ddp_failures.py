"""When one rank fails, the whole job stops fast, says which rank failed once, and leaves nothing.

Rank 1 raises at its 4th step while rank 0 waits for it inside DDP's gradient all-reduce: the
realistic failure. The job must exit non-zero within 3 s of the raise, print the traceback once
with the rank prefix, and leave no process behind. Ctrl-C (SIGINT to the whole process group, as a
terminal sends it) must stop every process too; so must ``kill -9`` of a spawn/fork parent (its
workers carry a parent-death signal). A rank that ignores SIGTERM is killed after the launcher's
1 s grace. All jobs run at once (module fixture): most of their time is importing torch, which
overlaps.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from ddp_helpers import SCRIPTS, start_job

from phalanx.testing.processes import Job, marked_processes

pytestmark = [pytest.mark.timeout(240), pytest.mark.timing]

_DEADLINE_SECONDS = 3.0
_FAILING = ("ddp", "ddp_spawn", "ddp_fork")
_INTERRUPTED = ("ddp_fork",)  # ddp's launcher is interrupted in core/tests/test_launchers.py
_PARENT_KILLED = ("ddp_spawn", "ddp_fork")  # ddp's ranks are children of rank 0, which is the parent
_GRACE_SECONDS = 1.0  # the launcher's wait between SIGTERM and SIGKILL
#: fail.py with SIGINT ignored, as a shell's ``command &`` starts it. Otherwise the workers would also
#: die of a SIGINT when their parent dies, and the test could not tell whether phalanx's own
#: parent-death signal (SIGKILL) works.
_BACKGROUNDED = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN);"
    f" sys.path.insert(0, {str(SCRIPTS)!r}); sys.argv = ['fail.py', '{{}}', '-1', 'hang'];"
    f" runpy.run_path({str(SCRIPTS / 'fail.py')!r}, run_name='__main__')"
)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    tmp = tmp_path_factory.mktemp("failures")
    started = {f"raise-{s}": start_job(tmp, f"raise-{s}", "fail.py", s, "1", "raise") for s in _FAILING}
    started["stubborn-ddp_fork"] = start_job(tmp, "stubborn-ddp_fork", "fail.py", "ddp_fork", "1", "stubborn")
    interrupted = {f"ctrlc-{s}": start_job(tmp, f"ctrlc-{s}", "fail.py", s, "-1", "hang") for s in _INTERRUPTED}
    killed = {f"kill9-{s}": start_job(tmp, f"kill9-{s}", "-c", _BACKGROUNDED.format(s)) for s in _PARENT_KILLED}
    started.update(interrupted)
    started.update(killed)
    pending = {**interrupted, **killed}
    orphaned: dict[str, Job] = {}
    deadline = time.monotonic() + 200
    # Poll every job in one loop, so each one's end time is seen within 20 ms.
    while (None in [job.poll() for job in started.values()] or orphaned) and time.monotonic() < deadline:
        for name, job in list(pending.items()):
            if job.stdout.count("READY") >= 2 or job.poll() is not None:
                job.interrupted_at = time.time()  # type: ignore[attr-defined]
                if job.poll() is None and name in interrupted:
                    job.signal_group(signal.SIGINT)
                elif job.poll() is None:
                    os.kill(job.pid, signal.SIGKILL)  # the parent only: its workers must follow by themselves
                    orphaned[name] = job
                del pending[name]
        for name, job in list(orphaned.items()):
            if not marked_processes(job.marker):
                job.workers_gone_at = time.time()  # type: ignore[attr-defined]
                del orphaned[name]
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
    if strategy != "ddp":  # the main process's error names the rank whose traceback is above it
        assert re.search(r"WorkerFailedError: rank 1 \(pid \d+\)", stderr), stderr
    assert not job.leftovers()


@pytest.mark.parametrize("strategy", _INTERRUPTED)
def test_ctrl_c_stops_every_process(jobs: dict[str, Job], strategy: str) -> None:
    job = jobs[f"ctrlc-{strategy}"]
    assert job.stdout.count("READY") == 2, job.output()
    assert job.process.returncode == 130, job.output()
    assert job.ended is not None and job.ended - job.interrupted_at < _DEADLINE_SECONDS  # type: ignore[attr-defined]
    assert "Traceback" not in job.stderr, job.stderr
    assert not job.leftovers()


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace(jobs: dict[str, Job]) -> None:
    job = jobs["stubborn-ddp_fork"]
    assert job.process.returncode != 0, job.output()
    raised = re.search(r"RAISING (\d+\.\d+)", job.stdout)
    assert raised and job.ended is not None, job.output()
    took = job.ended - float(raised.group(1))
    assert _GRACE_SECONDS <= took < _DEADLINE_SECONDS, f"stopped {took:.2f}s after the raise\n{job.output()}"
    assert not job.leftovers()


@pytest.mark.parametrize("strategy", _PARENT_KILLED)
def test_kill_9_of_the_parent_takes_its_workers_down(jobs: dict[str, Job], strategy: str) -> None:
    job = jobs[f"kill9-{strategy}"]
    assert job.stdout.count("READY") == 2, job.output()
    assert job.process.returncode == -signal.SIGKILL
    gone = getattr(job, "workers_gone_at", None)
    assert gone is not None, f"workers outlived their parent: {marked_processes(job.marker)}"
    assert gone - job.interrupted_at < _DEADLINE_SECONDS  # type: ignore[attr-defined]
