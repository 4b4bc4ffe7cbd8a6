"""Hangs users make, on 2 gloo ranks: the watchdog's report, SIGTERM during a hang, checked collectives,
and a stop decided on one rank.

The rank-0-only forward under fsdp runs with the Trainer's defaults (``hang_report_after=50``): the
report must appear within 60 s of the hang, name the callback's line on rank 0 and the collective
rank 1 waits in; then SIGTERM to the launcher must end every process within 30 s with exit code
143. The ddp case passes
``hang_report_after=10`` (the argument, and a minute less of CI).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from reliability_helpers import SCRIPTS, job_env, run_job, running

from phalanx.testing.processes import Job

#: Holds wall-clock bounds: under xdist it runs with the machine to itself (phalanx.testing.scheduling).
pytestmark = pytest.mark.timing

SCRIPT = SCRIPTS / "hang.py"
#: Measured figures land here for docs/reliability.md (one JSON line per case).
FIGURES = os.environ.get("PHALANX_RELIABILITY_FIGURES")


def _line_of(fragment: str) -> int:
    """The line number of ``fragment`` in hang.py (so the test follows edits of the script)."""
    for number, line in enumerate(SCRIPT.read_text().splitlines(), start=1):
        if fragment in line:
            return number
    raise AssertionError(f"{fragment!r} not in {SCRIPT}")


def _report(job: Job) -> str:
    """The job's stderr from the hang report on ("" before it)."""
    stderr = job.stderr
    start = stderr.find("[phalanx] hang report")
    return stderr[start:] if start >= 0 else ""


def _wait_until(condition: object, job: Job, timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert job.poll() is None, f"the job ended early\n{job.output()[-4000:]}"
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g} s\n{job.output()[-6000:]}"
        time.sleep(0.2)
    return time.monotonic()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("strategy", "rank0_line", "report_after"),
    [("fsdp", "pl_module(sample)", None), ("ddp", "pl_module.all_gather(sample)", 10.0)],
)
def test_rank0_only_collective_is_reported_within_a_minute_and_sigterm_ends_the_job(
    tmp_path: Path, strategy: str, rank0_line: str, report_after: float | None
) -> None:
    out = tmp_path / "out"
    extra = [] if report_after is None else [str(report_after)]
    limit = 50.0 if report_after is None else report_after
    with running(tmp_path, "hang.py", "rank0_forward", strategy, str(out), *extra, name="job", env=job_env()) as job:
        hung = _wait_until(lambda: (out / "validated0").exists(), job, 120, "validation")
        reported = _wait_until(lambda: "hang report" in job.stderr, job, limit + 15, "the hang report")
        # The report is written at once and its fix line (pointing at the docs) closes it, but for an
        # optional footer: once that line is there, the report is whole.
        _wait_until(lambda: "docs/reliability.md.\n" in _report(job), job, 30, "the report's end")
        report = _report(job)
        bound = 60.0 if report_after is None else report_after + 8  # the defaults: within a minute
        assert reported - hung <= bound, f"report after {reported - hung:.1f} s"
        assert f"hang.py:{_line_of(rank0_line)} in on_validation_epoch_end" in report, report
        rank1 = report[report.index("  rank 1 (") :]
        assert re.search(r"waiting in (all_reduce|broadcast|all_gather)", rank1), report
        assert "first differ at" in report, report
        sent = time.monotonic()
        os.kill(job.pid, signal.SIGTERM)
        code = job.wait(30)
        exit_seconds = time.monotonic() - sent
        assert not job.leftovers(), f"processes left behind\n{job.output()[-3000:]}"
    assert code == 143, job.output()[-4000:]
    assert exit_seconds < 30
    assert "exiting with 143" in job.stderr
    if FIGURES:
        with open(FIGURES, "a", encoding="utf-8") as handle:
            row = {
                "case": f"hang-{strategy}",
                "report_after_hang_s": round(reported - hung, 1),
                "sigterm_exit_s": round(exit_seconds, 1),
            }
            handle.write(json.dumps(row) + "\n")


@pytest.mark.timeout(150)
def test_mismatched_collectives_raise_on_every_rank_naming_both_call_sites(tmp_path: Path) -> None:
    env = job_env(PHALANX_DISTRIBUTED_DEBUG="1")
    started = time.monotonic()
    code, job = run_job(tmp_path, "hang.py", "mismatch", "ddp", str(tmp_path / "out"), timeout=120, env=env)
    seconds = time.monotonic() - started
    output = job.output()
    assert code != 0, output[-3000:]
    assert "CollectiveMismatchError" in output, output[-3000:]
    reduce_site = f"hang.py:{_line_of('trainer.strategy.reduce(torch.ones(3))')} in on_train_batch_end"
    broadcast_site = f"hang.py:{_line_of('trainer.strategy.broadcast(')} in on_train_batch_end"
    assert re.search(rf"rank 0: reduce\(mean\) float32\[3\] at \S*{re.escape(reduce_site)}", output), output[-3000:]
    assert re.search(rf"rank 1: broadcast\(src=0\) object at \S*{re.escape(broadcast_site)}", output), output[-3000:]
    assert seconds < 100  # seconds after the mismatch, not the process-group timeout


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("case", "expected_step"), [("one_rank_stop", 4), ("one_rank_stop_epoch", 6)])
def test_a_stop_set_on_one_rank_stops_every_rank_after_the_same_step(
    tmp_path: Path, case: str, expected_step: int
) -> None:
    """Rank 1 alone sets ``trainer.should_stop`` (after step 3, or at the first epoch's end)."""
    out = tmp_path / "out"
    code, job = run_job(tmp_path, "hang.py", case, "ddp", str(out), timeout=120)
    assert code == 0, job.output()[-3000:]
    ranks = {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    assert set(ranks) == {0, 1}
    # step 3's stop is agreed one check later (the asynchronous agreement); an epoch-end stop at once
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == expected_step
    assert ranks[0]["should_stop"] and ranks[1]["should_stop"]
