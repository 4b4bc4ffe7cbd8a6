"""Helpers for the FSDP tests: run scripts in their own process group, with a timeout, leaving nothing.

Named uniquely (not ``helpers``) because several packages' test folders may share one pytest run.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

from phalanx.testing.processes import run_command, run_commands

SCRIPTS = Path(__file__).parent / "scripts"
if str(SCRIPTS) not in sys.path:  # the scripts' shared model (common.py) is used by tests too
    sys.path.insert(0, str(SCRIPTS))
#: One run's limit. Fixtures chain up to 4 runs (conftest.py), so the tests' pytest-timeout marks are
#: sized as ``runs * RUN_TIMEOUT + margin``: this timeout, with its clean kill, always fires first.
RUN_TIMEOUT = 150.0
#: What every run adds to the test's environment (rank variables are never inherited).
_JOB_ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_phalanx(script: str, *args: str, timeout: float = RUN_TIMEOUT) -> str:
    """Run a phalanx script (it launches its own extra ranks); fail with its output on error."""
    result = run_command([str(SCRIPTS / script), *args], cwd=SCRIPTS, env=_JOB_ENV, timeout=timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{script} {' '.join(args)} exited with {result.returncode}:\n{output[-6000:]}"
    result.check_leftovers()
    return output


def pytest_timeout_for(runs: int) -> float:
    """A per-test pytest-timeout that lets ``runs`` chained runs hit their own timeout first."""
    return runs * RUN_TIMEOUT + 60.0


def run_torch_ranks(script: str, *args: str, world_size: int = 2, timeout: float = RUN_TIMEOUT) -> None:
    """Run a plain torch.distributed script once per rank, as torchrun would."""
    port = str(_free_port())
    env = {**_JOB_ENV, "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    commands = [[str(SCRIPTS / script), *args] for _ in range(world_size)]
    results = run_commands(commands, cwd=SCRIPTS, envs=[{**env, "RANK": str(r)} for r in range(world_size)], timeout=timeout)
    for rank, result in enumerate(results):
        assert result.returncode == 0, f"{script} rank {rank} exited with {result.returncode}:\n{result.output()[-6000:]}"
        result.check_leftovers()


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
