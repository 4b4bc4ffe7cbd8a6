"""Helpers for the DeepSpeed tests: run the training script in a subprocess, in its own session.

DeepSpeedStrategy re-runs the user's script per rank, so multi-process tests run
``scripts/ds_run.py`` in a subprocess (in its own session, killed as a group on timeout) and read
the JSON each rank writes. No test needs a DeepSpeed op to be compiled: the strategy skips the CPU
shm op by default and offloading uses torch's optimizers on CPU (see docs/deepspeed.md).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from phalanx.testing import processes

SCRIPT = Path(__file__).parent / "scripts" / "ds_run.py"
if str(SCRIPT.parent) not in sys.path:  # the tests reuse the script's model and data
    sys.path.insert(0, str(SCRIPT.parent))
#: Generous: two ranks import torch + deepspeed on a loaded 2-core machine.
RUN_TIMEOUT = 240


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _job_env() -> dict[str, str]:
    """What a run needs on top of the test's environment (rank variables are never inherited)."""
    return {"MASTER_ADDR": "127.0.0.1", "PYTHONFAULTHANDLER": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def pytest_timeout_for(runs: int) -> float:
    """A per-test pytest-timeout that lets ``runs`` chained runs hit their own timeout first."""
    return runs * RUN_TIMEOUT + 60.0


def run_command(command: list[str], *, timeout: float = RUN_TIMEOUT, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as a marked job (phalanx.testing's runner: killed whole on timeout, no leftovers)."""
    result = processes.run_command(command, cwd=cwd or Path.cwd(), timeout=timeout, env=_job_env())
    result.check_leftovers()
    return subprocess.CompletedProcess(command, result.returncode, result.stdout + result.stderr, "")


def run_script(
    out: Path, *args: str, torchrun: bool = False, expect_ok: bool = True, timeout: float = RUN_TIMEOUT
) -> dict[int, dict[str, Any]]:
    """Run ds_run.py with ``args`` writing to ``out``; return each rank's JSON by rank.

    ``torchrun=True`` starts the two ranks with ``torch.distributed.run`` instead of letting the
    strategy re-run the script.
    """
    out.mkdir(parents=True, exist_ok=True)
    launcher = [sys.executable]
    if torchrun:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port())]
    command = [*launcher, str(SCRIPT), *args, "--out", str(out), "--ref-port", str(free_port())]
    result = run_command(command, timeout=timeout, cwd=out)
    if expect_ok and result.returncode != 0:
        pytest.fail(f"ds_run.py {' '.join(args)} exited {result.returncode}:\n{result.stdout[-6000:]}")
    return {int(path.stem[4:]): json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))}
