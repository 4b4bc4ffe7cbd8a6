"""Launchers: re-running the script, stopping the job on failure or Ctrl-C, start-method checks.

The subprocess-launcher tests run ``launcher_scripts/launcher_job.py``, a two-process job without
torch, as real processes; every job must leave no process behind (found through the marker its
processes inherit).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from phalanx.errors import MisconfigurationError
from phalanx.launchers import MultiProcessingLauncher, SubprocessScriptLauncher
from phalanx.launchers._pickling import find_unpicklable
from phalanx.launchers.multiprocessing import check_start_method
from phalanx.testing.processes import Job

pytestmark = pytest.mark.timeout(120)

SCRIPTS = Path(__file__).parent / "launcher_scripts"
_DEADLINE_SECONDS = 3.0


def _job(tmp_path: Path, *args: str, module: bool = False) -> Job:
    command = (
        [sys.executable, "-m", "launcher_job", *args]
        if module
        else [sys.executable, str(SCRIPTS / "launcher_job.py"), *args]
    )
    return Job(command, tmp_path, env={"PYTHONPATH": str(SCRIPTS)} if module else {})


@pytest.fixture(autouse=True)
def _clean_launch_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "GROUP_RANK"):
        monkeypatch.delenv(key, raising=False)


def _wait_ready(job: Job, count: int = 2) -> None:
    deadline = time.monotonic() + 60
    while job.stdout.count("READY") < count:
        assert job.poll() is None, job.output()
        assert time.monotonic() < deadline, job.output()
        time.sleep(0.02)


@pytest.mark.parametrize("module", [False, True], ids=["script", "python-m"])
def test_reruns_the_command_with_the_rank_variables(tmp_path: Path, module: bool) -> None:
    job = _job(tmp_path, "ok", str(tmp_path), module=module)
    assert job.wait(60) == 0, job.output()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    port = ranks[0]["env"]["MASTER_PORT"]
    assert port and int(port) > 0
    for rank, facts in enumerate(ranks):
        assert facts["env"] == {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": "2",
            "NODE_RANK": "0",
            "LOCAL_RANK": str(rank),
        }
    assert ranks[0]["pid"] == job.pid != ranks[1]["pid"]
    assert ranks[1]["argv"][1:] == ["ok", str(tmp_path)]
    assert (tmp_path / "rank1.done").exists()  # the parent waited for its slower child
    assert job.stdout.count("RESULT ok") == 2
    assert not job.leftovers()


@pytest.mark.parametrize("failing", [0, 1])
def test_a_failing_rank_stops_the_job_within_3s(tmp_path: Path, failing: int) -> None:
    job = _job(tmp_path, f"raise{failing}")
    code = job.wait(60)
    assert code == 1, job.output()
    raised = float(job.stdout.split("RAISING ")[1].split()[0])
    assert job.ended is not None and job.ended - raised < _DEADLINE_SECONDS, job.output()
    assert job.stderr.count(f"ValueError: boom from rank {failing}") == 1, job.stderr
    assert f"[rank {failing}] ValueError: boom from rank {failing}" in job.stderr
    assert f"[rank {1 - failing}] Traceback" not in job.stderr
    assert "RESULT" not in job.stdout
    assert not job.leftovers()


@pytest.mark.parametrize("target", ["group", "parent"])
def test_ctrl_c_stops_every_rank(tmp_path: Path, target: str) -> None:
    job = _job(tmp_path, "sleep")
    _wait_ready(job)
    sent = time.time()
    if target == "group":
        job.signal_group(signal.SIGINT)
    else:
        os.kill(job.pid, signal.SIGINT)
    assert job.wait(30) == 130, job.output()
    assert job.ended is not None and job.ended - sent < _DEADLINE_SECONDS
    assert "Traceback" not in job.stderr
    assert not job.leftovers()


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    job = _job(tmp_path, "sleep")
    _wait_ready(job)
    os.kill(job.pid, signal.SIGKILL)
    job.wait(10)
    assert not job.leftovers(grace=_DEADLINE_SECONDS)  # the parent-death signal reached the child


def test_no_script_to_rerun_is_a_clear_error(tmp_path: Path) -> None:
    code = (
        "from phalanx.environments.local import LocalEnvironment\n"
        "from phalanx.launchers import SubprocessScriptLauncher\n"
        "SubprocessScriptLauncher(LocalEnvironment(), 2, 1).launch(print, 'x')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 1
    assert "MisconfigurationError" in result.stderr
    assert "no script to re-run" in result.stderr and "ddp_notebook" in result.stderr


def test_check_start_method_messages() -> None:
    check_start_method("spawn")
    with pytest.raises(MisconfigurationError, match=r"not supported on this platform.*ddp_spawn"):
        check_start_method("fork", available=("spawn",))  # e.g. Windows
    with pytest.raises(MisconfigurationError, match=r"CUDA is already initialised.*ddp_spawn"):
        check_start_method("fork", cuda_initialized=True)
    with pytest.raises(MisconfigurationError, match=r"'thread' is not a multiprocessing start method"):
        check_start_method("thread")


def test_interactive_compatibility() -> None:
    strategy = SimpleNamespace()
    assert MultiProcessingLauncher(strategy, "fork").is_interactive_compatible
    assert not MultiProcessingLauncher(strategy, "spawn").is_interactive_compatible
    assert not SubprocessScriptLauncher(SimpleNamespace(), 2, 1).is_interactive_compatible  # type: ignore[arg-type]


def test_launchers_pickle_without_their_processes() -> None:
    launcher = MultiProcessingLauncher(SimpleNamespace(x=1), "spawn")
    launcher.procs = [threading.Lock()]  # stands for process handles, which cannot be pickled
    assert pickle.loads(pickle.dumps(launcher)).procs == []


class Node:
    """A plain picklable object to build object graphs from."""

    trainer: Node
    fit_loop: Node
    callbacks: list[Any]
    lock: Any


def test_find_unpicklable_names_the_attribute_not_the_back_reference() -> None:
    trainer = Node()
    loop = Node()
    loop.trainer = trainer  # a back-reference: fails only because trainer does
    trainer.fit_loop = loop
    trainer.callbacks = [1, {"cb": Node()}]
    trainer.callbacks[1]["cb"].lock = threading.Lock()
    found = find_unpicklable(trainer, "trainer")
    assert found is not None and found[0] == "trainer.callbacks[1]['cb'].lock"
    trainer.callbacks[1]["cb"].lock = None
    assert find_unpicklable(trainer, "trainer") is None
