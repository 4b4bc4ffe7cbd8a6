"""Helpers for the model-parallel tests: run scripts in their own session, with a timeout, leaving nothing.

Named uniquely (not ``helpers``) because several packages' test folders may share one pytest run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from phalanx.testing.processes import run_command

SCRIPTS = Path(__file__).parent / "scripts"
if str(SCRIPTS) not in sys.path:  # the scripts' shared model (mp_common.py) is used by tests too
    sys.path.insert(0, str(SCRIPTS))
RUN_TIMEOUT = 150.0

#: The schedules checked against one process, on models whose layers are the blocks
#: (``Blocks<n>``: n blocks, grouped by the strategy): (tag, schedule, model, accumulate_grad_batches,
#: activation checkpointing of the MLP blocks).
SCHEDULE_RUNS = [
    ("s_1f1b_acc", "1f1b", "Blocks5", 2, False),  # 5 blocks -> stages of 3 and 2
    ("s_interleaved_1f1b", "interleaved_1f1b", "Blocks4", 1, False),
    ("s_looped_bfs", "looped_bfs", "Blocks5", 1, False),  # 4 stages of 2, 1, 1, 1 blocks
    ("s_interleaved_zero_bubble", "interleaved_zero_bubble", "Blocks4", 2, False),
    ("s_zbv_zero_bubble", "zbv_zero_bubble", "Blocks4", 1, False),
    ("s_zbv_checkpointed", "zbv_zero_bubble", "Blocks4", 1, True),  # split backward through recomputation
    ("s_dualpipe_v", "dualpipe_v", "Blocks5", 1, False),
]

#: The multi-stage schedules checked under dp 2 x pp 2 (FSDP per stage), 4 batches of Blocks4:
#: (tag, schedule, accumulate_grad_batches).
DP_SCHEDULE_RUNS = [
    ("dp2pp2_zbv", "zbv_zero_bubble", 1),
    ("dp2pp2_interleaved_zb", "interleaved_zero_bubble", 2),
]

#: What every run adds to the test's environment (rank variables are never inherited).
JOB_ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def run_script(script: str, *args: str, timeout: float = RUN_TIMEOUT, check: bool = True) -> tuple[int, str, float]:
    """Run a phalanx script (it launches its own ranks); returns (exit code, output, seconds).

    On timeout, or when any process of the script outlives it, everything is killed and the test fails.
    """
    result = run_command([str(SCRIPTS / script), *args], cwd=SCRIPTS, env=JOB_ENV, timeout=timeout)
    output = result.stdout + result.stderr
    result.check_leftovers()
    if check:
        assert result.returncode == 0, f"{script} {' '.join(args)} exited with {result.returncode}:\n{output[-6000:]}"
    return result.returncode, output, result.seconds


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
