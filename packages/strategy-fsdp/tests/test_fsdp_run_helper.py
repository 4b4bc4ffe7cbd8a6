"""The run helper's promise: however a wait ends, the new-session process group it started dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from fsdp_testing import _wait_all

_PARENT_AND_CHILD = (
    "import subprocess, sys, time;"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
    "print('up', flush=True); time.sleep(60)"
)


class _Interrupted(Exception):
    """Stands for pytest-timeout's exception (or any other) raised while the helper waits."""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(60)
def test_an_interrupted_wait_kills_the_whole_group() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _PARENT_AND_CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(_Interrupted):
            _wait_all([proc], 30.0, "sleeper")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    deadline = time.monotonic() + 5
    while _group_alive(proc.pid) and time.monotonic() < deadline:  # the orphaned child is reaped by init
        time.sleep(0.05)
    assert not _group_alive(proc.pid), "the group outlived the interrupted wait"
