"""Helpers for the DeepSpeed tests: run the training script in a subprocess, in its own session.

DeepSpeedStrategy re-runs the user's script per rank, so multi-process tests run
``scripts/ds_run.py`` in a subprocess (in its own session, killed as a group on timeout) and read
the JSON each rank writes. No test needs a DeepSpeed op to be compiled: the strategy skips the CPU
shm op by default and offloading uses torch's optimizers on CPU (see docs/deepspeed.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "ds_run.py"
if str(SCRIPT.parent) not in sys.path:  # the tests reuse the script's model and data
    sys.path.insert(0, str(SCRIPT.parent))
#: Generous: two ranks import torch + deepspeed on a loaded 2-core machine.
RUN_TIMEOUT = 240


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _clean_env() -> dict[str, str]:
    """The test's environment minus rank variables, so the script launches its own ranks."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT")}
    env["MASTER_ADDR"] = "127.0.0.1"
    env["PYTHONFAULTHANDLER"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def pytest_timeout_for(runs: int) -> float:
    """A per-test pytest-timeout that lets ``runs`` chained runs hit their own timeout first."""
    return runs * RUN_TIMEOUT + 60.0


def run_command(command: list[str], *, timeout: float = RUN_TIMEOUT, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a new session; on timeout kill the whole group (ranks included) and fail."""
    proc = subprocess.Popen(
        command, env=_clean_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        output, _ = proc.communicate()
        pytest.fail(f"{' '.join(command)} timed out after {timeout}s; output tail:\n{output[-4000:]}")
    except BaseException:  # pytest-timeout, Ctrl-C, ...: the new session would outlive the test
        _kill_group(proc)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, output, "")


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
