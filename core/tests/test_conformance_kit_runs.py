"""The kit's own run machinery: a run that leaves a process behind is caught, whichever way it hid.

These are what stand behind every kit check's "nothing left running" promise, so each is shown
failing on a real leak: a grandchild re-parented to init in a session of its own (found by the
marker variable), and one that cleared its environment but stayed in the run's session (found by
the session id). No torch: plain ``python`` children.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from phalanx.testing import run_command, run_script

#: Holds wall-clock bounds: under xdist it runs with the machine to itself (phalanx.testing.scheduling).
pytestmark = pytest.mark.timing

_LEAVE_A_DAEMON = """
import os, subprocess, sys
# A grandchild that outlives this script: re-parented to init when the script exits.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], {how})
print("started")
"""


def _script(tmp_path: Path, how: str) -> Path:
    path = tmp_path / "leaky.py"
    path.write_text(textwrap.dedent(_LEAVE_A_DAEMON.format(how=how)))
    return path


def _gone(pid: int, within: float = 5.0) -> bool:
    """Whether ``pid`` is dead (or a zombie waiting for init to reap it) within ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    "how",
    [
        pytest.param("start_new_session=True", id="own-session-found-by-marker"),
        pytest.param("env={'PATH': os.environ['PATH']}", id="cleared-env-found-by-session"),
    ],
)
def test_a_leftover_grandchild_is_reported_and_killed(tmp_path: Path, how: str) -> None:
    result = run_script(_script(tmp_path, how), timeout=60)
    assert result.returncode == 0 and "started" in result.stdout
    assert "time.sleep(60)" in result.leftovers, f"the leftover was not found: {result.leftovers!r}"
    with pytest.raises(AssertionError, match="left processes running"):
        result.check()
    assert _gone(int(result.leftovers.split(":", 1)[0])), "the leftover was reported but not killed"


def test_a_clean_run_has_no_leftovers_and_keeps_its_logs_out_of_cwd(tmp_path: Path) -> None:
    result = run_command([sys.executable, "-c", "print('hello')"], cwd=tmp_path, timeout=60)
    assert result.check().stdout.strip() == "hello"
    assert result.leftovers == "" and result.ended is not None
    assert list(tmp_path.iterdir()) == [], "run logs were written into the working directory"


def test_a_hanging_run_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    path = tmp_path / "hang.py"
    path.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        "open('child.pid', 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="did not finish within 2s"):
        run_script(path, timeout=2)
    assert time.monotonic() - started < 10
    assert _gone(int((tmp_path / "child.pid").read_text())), "the hanging run's child survived the timeout"
