"""Helpers for the FSDP tests: run scripts in their own process group, with a timeout, leaving nothing.

Named uniquely (not ``helpers``) because several packages' test folders may share one pytest run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
if str(SCRIPTS) not in sys.path:  # the scripts' shared model (common.py) is used by tests too
    sys.path.insert(0, str(SCRIPTS))
#: One run's limit. Fixtures chain up to 4 runs (conftest.py), so the tests' pytest-timeout marks are
#: sized as ``runs * RUN_TIMEOUT + margin``: this timeout, with its clean kill, always fires first.
RUN_TIMEOUT = 150.0
#: Variables that would make a child think it is already a rank of some job.
_JOB_VARS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK")


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _JOB_VARS}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"})
    env.update(extra or {})
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kill_groups(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()


def _wait_all(procs: list[subprocess.Popen[str]], timeout: float, what: str) -> list[tuple[int, str]]:
    """Wait for every process; on timeout, or any interruption, kill every process group.

    The interruption may be pytest-timeout's own (raised in this thread while we wait), Ctrl-C or
    any other exception: the new-session groups would otherwise survive the test session.
    """
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((proc.returncode, out))
    except subprocess.TimeoutExpired:
        _kill_groups(procs)
        pytest.fail(f"{what} did not finish within {timeout:.0f}s; its process groups were killed")
    except BaseException:
        _kill_groups(procs)
        raise
    for proc in procs:  # re-executed ranks share their launcher's group: none may outlive it
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            continue
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{what} left processes behind in group {proc.pid}")
    return results


def run_phalanx(script: str, *args: str, timeout: float = RUN_TIMEOUT) -> str:
    """Run a phalanx script (it launches its own extra ranks); fail with its output on error."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=_child_env(),
        cwd=str(SCRIPTS),
    )
    [(code, out)] = _wait_all([proc], timeout, script)
    assert code == 0, f"{script} {' '.join(args)} exited with {code}:\n{out[-6000:]}"
    return out


def pytest_timeout_for(runs: int) -> float:
    """A per-test pytest-timeout that lets ``runs`` chained runs hit their own timeout first."""
    return runs * RUN_TIMEOUT + 60.0


def run_torch_ranks(script: str, *args: str, world_size: int = 2, timeout: float = RUN_TIMEOUT) -> None:
    """Run a plain torch.distributed script once per rank, as torchrun would."""
    port = str(_free_port())
    procs: list[subprocess.Popen[str]] = []
    try:
        _start_ranks(procs, script, args, world_size, port)
    except BaseException:
        _kill_groups(procs)
        raise
    for rank, (code, out) in enumerate(_wait_all(procs, timeout, script)):
        assert code == 0, f"{script} rank {rank} exited with {code}:\n{out[-6000:]}"


def _start_ranks(procs: list[subprocess.Popen[str]], script: str, args: tuple[str, ...], world_size: int, port: str) -> None:
    """Start one process per rank into ``procs`` (appended one by one, so a failure kills the started)."""
    for rank in range(world_size):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPTS / script), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                env=_child_env(env),
                cwd=str(SCRIPTS),
            )
        )


def read_ranks(out: Path, tag: str, world_size: int = 2) -> list[dict[str, Any]]:
    return [json.loads((out / f"{tag}_rank{r}.json").read_text()) for r in range(world_size)]


def ppid_of(proc: Path) -> int | None:
    """Parent pid of a live process from /proc (None for zombies and vanished processes)."""
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[1]) if fields[0] != "Z" else None
