"""Preemption: a signal to the launcher or to one rank → same-step stop, one checkpoint, exit 143, exact resume.

Each case trains 12 steps (two epochs of 6) on 2 ranks, signals after step 3 (mid-epoch), checks
the exit code, the time to exit and the checkpoint, then resumes with ``fit(ckpt_path="last")``
and compares the final weights bit for bit with an uninterrupted run (same processes) and, within
float rounding, with the plain-PyTorch reference computed here.

The ranks the signal reaches wait after step 3 until their handler has seen it (preempt.py), so
every case stops after step 4 (the agreement started at step 3's check is read at the next one) on
a fast machine and a loaded one alike; the only wall-clock bound left is a generous 30 s to exit,
so these tests share the machine like any other.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest
import torch
from rel_common import reference_weights
from reliability_helpers import job_env, run_job, running

from phalanx.testing.processes import Job

#: id: (strategy, signal, who receives it, extra environment)
CASES = {
    "ddp-sigterm-rank1": ("ddp", signal.SIGTERM, "rank1", {}),
    "ddp-sigusr1-launcher": ("ddp", signal.SIGUSR1, "launcher", {"PHALANX_PREEMPTION_SIGNALS": "SIGTERM,SIGUSR1"}),
    "ddp_spawn-sigterm-launcher": ("ddp_spawn", signal.SIGTERM, "launcher", {}),
    "fsdp-sigterm-launcher": ("fsdp", signal.SIGTERM, "launcher", {}),
    "deepspeed-sigterm-rank1": ("deepspeed_stage_2", signal.SIGTERM, "rank1", {}),
}
TOLERANCE = {"deepspeed_stage_2": 1e-5}
#: Measured figures land here for docs/reliability.md (one JSON line per case).
FIGURES = os.environ.get("PHALANX_RELIABILITY_FIGURES")


def _wait_for(path: Path, job: Job, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert job.poll() is None, f"the job ended early\n{job.output()[-4000:]}"
        assert time.monotonic() < deadline, f"{path.name} never appeared\n{job.output()[-4000:]}"
        time.sleep(0.01)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("case", list(CASES))
def test_preemption_checkpoints_exits_143_and_resumes_exactly(tmp_path: Path, case: str) -> None:
    strategy, signum, target, extra = CASES[case]
    # The rank that surely gets the signal: rank 1, or rank 0 for the launcher's (popen's rank 0 is
    # the launcher; ddp_spawn's parent forwards it to both ranks). The agreement tells the other.
    env = job_env(**extra, PREEMPT_SIGNALLED_RANKS="1" if target == "rank1" else "0")
    with running(tmp_path, "preempt.py", "run", strategy, str(tmp_path), name="run", env=env) as job:
        _wait_for(tmp_path / "step3", job, 150)
        _wait_for(tmp_path / "pid1", job, 10)
        pid = job.pid if target == "launcher" else int((tmp_path / "pid1").read_text())
        sent = time.monotonic()
        os.kill(pid, signum)
        code = job.wait(60)
        exit_seconds = time.monotonic() - sent
        assert not job.leftovers(), "processes left behind"
    assert code == 143, job.output()[-6000:]
    checkpoint = tmp_path / "checkpoints" / "preempted.ckpt"
    assert checkpoint.exists(), job.output()[-4000:]
    stopped = [line for line in job.stderr.splitlines() if "preempted at step" in line]
    steps = {int(line.split("preempted at step ")[1].split(";")[0]) for line in stopped}
    assert len(stopped) == 2 and len(steps) == 1, f"ranks did not stop at the same step: {stopped}"
    stop_step = steps.pop()
    assert stop_step == 4, stop_step  # the signal in by step 3's check; the agreement read at step 4's
    code, resume = run_job(
        tmp_path, "preempt.py", "resume", strategy, str(tmp_path), timeout=240, name="resume", env=job_env()
    )
    assert code == 0, resume.output()[-6000:]
    result = json.loads((tmp_path / "resumed.json").read_text())
    assert result["global_step"] == 12
    expected = reference_weights(steps=12, epochs=2)
    worst = 0.0
    for name, values in result["weights"].items():
        assert values == result["straight"][name], f"{case}: {name} differs from the uninterrupted run"
        difference = (torch.tensor(values) - expected[name].flatten()).abs().max().item()
        worst = max(worst, difference)
        assert difference <= TOLERANCE.get(strategy, 1e-6), (name, difference)
    steps_lost = stop_step - 3  # the step trained after the signal's step is in the checkpoint: none lost
    if FIGURES:
        with open(FIGURES, "a", encoding="utf-8") as handle:
            handle.write(
                json.dumps(
                    {
                        "case": case,
                        "exit_s": round(exit_seconds, 2),
                        "stop_step": stop_step,
                        "steps_lost": 0,
                        "extra_steps": steps_lost,
                        "max_abs_vs_torch": worst,
                    }
                )
                + "\n"
            )
    assert exit_seconds < 30, f"took {exit_seconds:.1f}s to exit after the signal"


def _stand_in_scontrol(bin_dir: Path, log: Path) -> None:
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.timeout(200)
def test_slurm_auto_requeue_runs_scontrol_requeue(tmp_path: Path) -> None:
    """Two tasks started the way srun starts them; SLURM's warning signal reaches task 1 only."""
    log = tmp_path / "scontrol.log"
    _stand_in_scontrol(tmp_path / "bin", log)
    base = job_env(PREEMPT_SIGNALLED_RANKS="1")
    base.update(
        {
            "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
            "SLURM_JOB_ID": "4242",
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_NNODES": "1",
            "SLURM_NODEID": "0",
            "SLURM_JOB_NAME": "train",
        }
    )
    jobs = []
    try:
        for rank in range(2):
            env = {**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)}
            command = [
                sys.executable,
                str(Path(__file__).parent / "scripts" / "preempt.py"),
                "run",
                "ddp",
                str(tmp_path),
                "slurm",
            ]
            jobs.append(Job(command, tmp_path, env=env, name=f"task{rank}", warm=True))
        _wait_for(tmp_path / "step3", jobs[0], 150)
        _wait_for(tmp_path / "pid1", jobs[1], 10)
        os.kill(jobs[1].pid, signal.SIGUSR1)  # sbatch --signal=USR1@90
        codes = [job.wait(60) for job in jobs]
    finally:
        for job in jobs:
            job.kill_leftovers()
    assert codes == [143, 143], "\n".join(job.output()[-3000:] for job in jobs)
    assert log.read_text().split() == ["requeue", "4242"]
    assert (tmp_path / "checkpoints" / "preempted.ckpt").exists()
