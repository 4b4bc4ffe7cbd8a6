"""The leak check every suite installs finds what a test leaves behind, and nothing else.

Each case provokes one real leak -- a grandchild re-parented to init in a session of its own, a
process that cleared its environment, a listening socket, a changed variable -- between
``take_snapshot`` and ``find_leaks``, the two halves of the autouse fixture.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from phalanx.testing.leaks import CASE_VAR, Snapshot, find_leaks, take_snapshot
from phalanx.testing.processes import Job, marked_processes

pytestmark = pytest.mark.timeout(60)

#: Starts a grandchild in a new session that sleeps, prints its pid, and exits: the grandchild is
#: re-parented to init, outside this process's children and process group.
_ORPHAN = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(child.pid, flush=True)
    """
)


@contextmanager
def _checked() -> Iterator[tuple[Snapshot, list[str]]]:
    """Run the block as a test would run under the fixture; collect what find_leaks reports."""
    outer = os.environ.get(CASE_VAR)
    before = take_snapshot()
    os.environ[CASE_VAR] = before.marker
    problems: list[str] = []
    try:
        yield before, problems
    finally:
        if outer is None:
            os.environ.pop(CASE_VAR, None)
        else:
            os.environ[CASE_VAR] = outer
        problems.extend(find_leaks(before, grace=0.5))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def test_a_clean_test_reports_nothing() -> None:
    with _checked() as (_, problems):
        subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=30)
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
    assert problems == []


def test_a_reparented_grandchild_in_its_own_session_is_found_and_killed() -> None:
    with _checked() as (_, problems):
        out = subprocess.run([sys.executable, "-c", _ORPHAN], capture_output=True, text=True, check=True, timeout=30)
        orphan = int(out.stdout.split()[0])
        assert _alive(orphan) and os.getsid(orphan) != os.getsid(0)
    assert len(problems) == 1 and problems[0].startswith("processes left running"), problems
    assert f"{orphan}: " in problems[0]
    time.sleep(0.1)
    assert not _alive(orphan), "the leftover was reported but not killed"


def test_a_child_that_cleared_its_environment_is_found_by_its_process_group() -> None:
    with _checked() as (_, problems):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={})
    child.wait(timeout=10)  # killed by find_leaks
    assert len(problems) == 1 and f"{child.pid}: " in problems[0], problems


def test_a_listening_socket_and_changed_variables_are_reported_and_the_variables_restored() -> None:
    os.environ["PHALANX_LEAK_TEST_KEPT"] = "before"
    server = None
    try:
        with _checked() as (_, problems):
            server = socket.socket()
            server.bind(("127.0.0.1", 0))
            server.listen()
            port = server.getsockname()[1]
            os.environ["PHALANX_LEAK_TEST_KEPT"] = "changed"
            os.environ["PHALANX_LEAK_TEST_ADDED"] = "1"
    finally:
        if server is not None:
            server.close()
        restored = os.environ.pop("PHALANX_LEAK_TEST_KEPT", None)
    assert f"TCP ports left listening: [{port}]" in problems
    assert "environment variables changed (now restored): ['PHALANX_LEAK_TEST_ADDED', 'PHALANX_LEAK_TEST_KEPT']" in problems
    assert restored == "before" and "PHALANX_LEAK_TEST_ADDED" not in os.environ


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_job_wait_kills_the_job_when_interrupted(tmp_path: Path, warm: bool) -> None:
    """Any exception inside Job.wait (pytest-timeout's, Ctrl-C) ends the job's processes, orphans
    included, whether the job was started as a new interpreter or forked from the warm parent."""
    script = tmp_path / "orphan_then_sleep.py"
    script.write_text(_ORPHAN + "import time\ntime.sleep(60)\n")
    job = Job([str(script)], tmp_path, warm=warm)
    assert job.warm is warm

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        deadline = time.monotonic() + 20
        while not job.stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        orphan = int(job.stdout.split()[0])
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            job.wait(timeout=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert job.process.returncode is not None, "the job's own process still runs"
    time.sleep(0.1)
    assert not _alive(orphan) and marked_processes(job.marker) == []
