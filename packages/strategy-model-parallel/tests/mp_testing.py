"""Helpers for the model-parallel tests: run scripts in their own session, with a timeout, leaving nothing.

Named uniquely (not ``helpers``) because several packages' test folders may share one pytest run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
if str(SCRIPTS) not in sys.path:  # the scripts' shared model (mp_common.py) is used by tests too
    sys.path.insert(0, str(SCRIPTS))
RUN_TIMEOUT = 150.0
#: Variables that would make a child think it is already a rank of some job.
_JOB_VARS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK")


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _JOB_VARS}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"})
    return env


def run_script(script: str, *args: str, timeout: float = RUN_TIMEOUT, check: bool = True) -> tuple[int, str, float]:
    """Run a phalanx script (it launches its own ranks); returns (exit code, output, seconds).

    On timeout, or when any process of the script's session outlives it, the session is killed
    and the test fails.
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=child_env(),
        cwd=str(SCRIPTS),
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{script} did not finish within {timeout:.0f}s; its processes were killed:\n{out[-4000:]}")
    elapsed = time.monotonic() - start
    time.sleep(0.2)
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        pass
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{script} left processes behind in its session {proc.pid}")
    if check:
        assert proc.returncode == 0, f"{script} {' '.join(args)} exited with {proc.returncode}:\n{out[-6000:]}"
    return proc.returncode, out, elapsed


def read_ranks(out: Path, tag: str, world_size: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"{tag}_rank{r}.json").read_text()) for r in range(world_size)]


def ppid_of(proc: Path) -> int | None:
    """Parent pid of a live process from /proc (None for zombies and vanished processes)."""
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[1]) if fields[0] != "Z" else None
