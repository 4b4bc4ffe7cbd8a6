"""Helpers of the reliability tests: run a script as a real job, read what its ranks wrote.

Every job runs in a session of its own with a marker its descendants inherit
(:class:`phalanx.testing.processes.Job`), is killed as a whole on timeout or on any exception, and
is checked for leftovers afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from phalanx.testing.processes import Job

__all__ = ["SCRIPTS", "free_port", "job_env", "rank_results", "run_job", "running"]

SCRIPTS = Path(__file__).parent / "scripts"
if str(SCRIPTS) not in sys.path:  # the tests compute their references with the scripts' model
    sys.path.insert(0, str(SCRIPTS))
_RANK_VARS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_env(**extra: str) -> dict[str, str]:
    """What a job needs on top of this environment: one thread (like torchrun), CPU DeepSpeed."""
    env = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "PYTHONFAULTHANDLER": "1"}
    env["MASTER_PORT"] = str(free_port())
    env.update(extra)
    return env


def _command(script: str, *args: str, torchrun: int = 0) -> list[str]:
    if torchrun:  # torchrun on this machine: the script once per rank, no phalanx launcher
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(torchrun),
                str(SCRIPTS / script), *args]  # fmt: skip
    return [sys.executable, str(SCRIPTS / script), *args]


@contextmanager
def running(
    workdir: Path, script: str, *args: str, name: str = "job", env: dict[str, str] | None = None, torchrun: int = 0
) -> Iterator[Job]:
    """Start a script job (under torchrun with ``torchrun`` ranks if given); whatever happens in the
    block, nothing of it outlives the block."""
    saved = {key: os.environ.pop(key) for key in _RANK_VARS if key in os.environ}
    try:
        job = Job(_command(script, *args, torchrun=torchrun), workdir, env=env or job_env(), name=name, warm=True)
    finally:
        os.environ.update(saved)
    try:
        yield job
    finally:
        if job.poll() is None:
            job.kill_leftovers()
            job.process.kill()
            job.process.wait()
        job.kill_leftovers()


def run_job(
    workdir: Path, script: str, *args: str, timeout: float, name: str = "job", env: dict[str, str] | None = None
) -> tuple[int, Job]:
    """Run a script job to its end (killed and failed after ``timeout``); return its code and the job."""
    with running(workdir, script, *args, name=name, env=env) as job:
        code = job.wait(timeout)
        left = job.leftovers()
        assert not left, f"processes left behind: {left}\n{job.output()}"
    return code, job


def rank_results(out: Path) -> dict[int, Any]:
    """``rank<R>.json`` files a script wrote, by rank."""
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
