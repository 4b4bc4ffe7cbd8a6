"""phalanx.testing.scheduling under real pytest-xdist workers: units of work, and a timed test alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

#: Every test notes, while it runs, that it is inside (a file per test in INSIDE), and which worker
#: ran it (a file per test in ran/).
CONFTEST = """
import os, pathlib, time
import pytest

INSIDE = pathlib.Path(os.environ["INSIDE"])

@pytest.fixture(autouse=True)
def inside(request):
    me = INSIDE / request.node.name
    me.write_text(os.environ["PYTEST_XDIST_WORKER"])
    (INSIDE.parent / "ran" / request.node.name).write_text(os.environ["PYTEST_XDIST_WORKER"])
    started = time.monotonic()
    yield me
    me.unlink()
    # one line per test, appended whole: worker, name, start, end (one clock for every process)
    line = f"{os.environ['PYTEST_XDIST_WORKER']} {request.node.name} {started} {time.monotonic()}\\n"
    fd = os.open(INSIDE.parent / "windows", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, line.encode())
    os.close(fd)

def others(me):
    return sorted(p.name for p in INSIDE.iterdir() if p != me)

def work(seconds):
    # stands for a test's own work: the machine is busy, nothing is waited for
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))
"""


def _run_xdist(
    tmp_path: Path, *options: str, workers: int = 2, suite: str = "suite", **env: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "inside").mkdir(exist_ok=True)
    (tmp_path / "ran").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), "--dist", "loadgroup",
         "-p", "phalanx.testing.scheduling", *options, str(tmp_path / suite)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path / suite), "INSIDE": str(tmp_path / "inside"), **env},
    )  # fmt: skip


def test_a_timed_test_runs_alone_while_the_others_run_two_at_a_time(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for index in range(4):
        (suite / f"test_work_{index}.py").write_text(
            "from conftest import others, work\n\n"
            + "".join(
                f"def test_work_{index}_{case}(inside):\n"
                f"    assert 'test_alone' not in others(inside)\n"
                f"    work(0.2)\n"
                f"    assert 'test_alone' not in others(inside)\n\n"
                for case in range(5)
            )
        )
    (suite / "test_timed.py").write_text(
        "import pytest\nfrom conftest import others, work\n\n"
        "@pytest.mark.timing\n"
        "def test_alone(inside):\n"
        "    assert others(inside) == []\n"
        "    work(0.5)\n"
        "    assert others(inside) == []\n"
    )
    result = _run_xdist(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "21 passed" in result.stdout, result.stdout
    workers = {path.read_text() for path in (tmp_path / "ran").iterdir()}
    assert workers == {"gw0", "gw1"}, "the untimed tests did not spread over both workers"


def test_cpu_slots_let_a_waiting_test_run_beside_two_working_ones_and_never_three_working(tmp_path: Path) -> None:
    """Three workers, ``--phalanx-cpu-slots 2``: the test marked ``waits`` waits for two working
    tests to be inside at once beside it (a deadline, not a sleep), and no working test ever sees
    two others working. Without the option three work at once: there each test of a second suite
    waits for two others inside (or for one that saw them), which passes only if three ran together."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_a_waits.py").write_text(
        "import time\nimport pytest\nfrom conftest import others\n\n"
        "@pytest.mark.waits\n"
        "def test_waits(inside):\n"
        "    deadline = time.monotonic() + 60\n"
        "    while len([o for o in others(inside) if o.startswith('test_work')]) < 2:\n"
        "        assert time.monotonic() < deadline, 'two working tests never ran beside this one'\n"
        "        time.sleep(0.01)\n"
    )
    for index in range(4):
        (suite / f"test_work_{index}.py").write_text(
            "from conftest import others, work\n\n"
            + "".join(
                f"def test_work_{index}_{case}(inside):\n"
                f"    for _ in range(6):\n"
                f"        working = [o for o in others(inside) if o.startswith('test_work')]\n"
                f"        assert len(working) <= 1, f'working beside {{working}}'\n"
                f"        work(0.05)\n\n"
                for case in range(4)
            )
        )
    result = _run_xdist(tmp_path, "--phalanx-cpu-slots", "2", workers=3)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "17 passed" in result.stdout, result.stdout
    together = tmp_path / "together"
    together.mkdir()
    (together / "conftest.py").write_text(CONFTEST)
    (together / "test_three.py").write_text(
        "import time\nfrom conftest import INSIDE, others\n\n"
        + "".join(
            f"def test_three_{case}(inside):\n"
            f"    seen = INSIDE.parent / 'three'\n"
            f"    deadline = time.monotonic() + 60\n"
            f"    while not seen.exists():\n"
            f"        if len(others(inside)) >= 2:\n"
            f"            seen.touch()\n"
            f"        assert time.monotonic() < deadline, 'three tests never ran at once'\n"
            f"        time.sleep(0.01)\n\n"
            for case in range(6)
        )
    )
    for leftover in (tmp_path / "inside").iterdir():
        leftover.unlink()
    unlimited = _run_xdist(tmp_path, workers=3, suite="together")
    assert unlimited.returncode == 0 and "6 passed" in unlimited.stdout, unlimited.stdout + unlimited.stderr


def test_a_module_with_a_shared_fixture_and_the_users_of_a_job_running_session_fixture_each_run_on_one_worker(
    tmp_path: Path,
) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    runs = tmp_path / "runs"
    (suite / "conftest.py").write_text(
        CONFTEST
        + textwrap.dedent(f"""
        import subprocess, sys

        @pytest.fixture(scope="session")
        def finished_job():
            with open({str(runs)!r}, "a") as handle:
                handle.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
            return subprocess.run([sys.executable, "-c", "pass"]).returncode
        """)
    )
    for index in range(3):
        (suite / f"test_reads_{index}.py").write_text(
            "".join(
                f"def test_reads_{index}_{case}(finished_job):\n    assert finished_job == 0\n\n" for case in range(3)
            )
        )
    for index in range(4):  # a module-scoped fixture: the module is one unit
        (suite / f"test_module_{index}.py").write_text(
            "import pytest\nfrom conftest import work\n\n"
            "@pytest.fixture(scope='module')\ndef prepared():\n    return 1\n\n"
            + "".join(f"def test_module_{index}_{case}(prepared):\n    work(0.05)\n\n" for case in range(4))
        )
    result = _run_xdist(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(runs.read_text().split()) == 1, f"the session fixture ran on {runs.read_text().split()}"
    by_unit: dict[str, set[str]] = {}
    for path in (tmp_path / "ran").iterdir():
        unit = "reads" if path.name.startswith("test_reads_") else path.name.rsplit("_", 1)[0]
        by_unit.setdefault(unit, set()).add(path.read_text())
    assert len(by_unit) == 5, by_unit
    assert all(len(workers) == 1 for workers in by_unit.values()), f"a unit was split over workers: {by_unit}"
    assert set().union(*by_unit.values()) == {"gw0", "gw1"}, by_unit


def test_timed_tests_run_as_one_block_first(tmp_path: Path) -> None:
    """Timed tests of two modules, with untimed modules between them in collection order: one
    worker runs all of them back to back, first, and no other test starts or ends inside that block."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for name in ("a", "c"):
        (suite / f"test_{name}_timed.py").write_text(
            "import pytest\nfrom conftest import others, work\n\npytestmark = pytest.mark.timing\n\n"
            + "".join(
                f"def test_timed_{name}{case}(inside):\n    assert others(inside) == []\n    work(0.2)\n\n"
                for case in range(3)
            )
        )
    for name in ("b", "d"):
        (suite / f"test_{name}_work.py").write_text(
            "from conftest import work\n\n"
            + "".join(f"def test_work_{name}{case}(inside):\n    work(0.3)\n\n" for case in range(6))
        )
    for name in ("e", "f"):  # units larger than the timed block: xdist alone would hand these out first
        (suite / f"test_{name}_module.py").write_text(
            "import pytest\nfrom conftest import work\n\n@pytest.fixture(scope='module')\ndef prepared():\n    return 1\n\n"
            + "".join(f"def test_module_{name}{case}(prepared):\n    work(0.05)\n\n" for case in range(8))
        )
    result = _run_xdist(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    windows = [line.split() for line in (tmp_path / "windows").read_text().splitlines()]
    timed = [
        (worker, float(start), float(end)) for worker, name, start, end in windows if name.startswith("test_timed_")
    ]
    assert len(timed) == 6, windows
    assert len({worker for worker, _, _ in timed}) == 1, f"the timed tests were split over workers: {timed}"
    block = (min(start for _, start, _ in timed), max(end for _, _, end in timed))
    inside_block = [name for _, name, start, end in windows if not name.startswith("test_timed_")
                    and float(end) > block[0] and float(start) < block[1]]  # fmt: skip
    assert not inside_block, f"untimed tests ran inside the timed block: {inside_block}"
    first = min((float(start), name) for worker, name, start, _ in windows if worker == timed[0][0])
    assert first[1].startswith("test_timed_"), f"the timed block's worker began with {first[1]}"


def test_recorded_durations_start_the_longest_tests_first(tmp_path: Path) -> None:
    """A run records every test's seconds; the next run, given them, starts the long test collected
    last before the quick ones (without them, xdist's order would leave it to the end)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    for index in range(6):
        (suite / f"test_a{index}_quick.py").write_text(
            "from conftest import work\n\n"
            + "".join(f"def test_quick_{index}_{case}(inside):\n    work(0.05)\n\n" for case in range(2))
        )
    (suite / "test_z_long.py").write_text("from conftest import work\n\ndef test_long(inside):\n    work(1.0)\n")
    durations = tmp_path / "durations.json"
    recorded = _run_xdist(tmp_path, f"--phalanx-durations={durations}", "--phalanx-record-durations")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    seconds = json.loads(durations.read_text())
    assert len(seconds) == 13 and seconds["suite/test_z_long.py::test_long"] >= 1.0, seconds  # ids from the rootdir
    assert all(value < 1.0 for key, value in seconds.items() if "quick" in key), seconds
    (tmp_path / "windows").unlink()
    result = _run_xdist(tmp_path, f"--phalanx-durations={durations}")
    assert result.returncode == 0, result.stdout + result.stderr
    windows = sorted(
        (float(start), name)
        for _, name, start, _ in (line.split() for line in (tmp_path / "windows").read_text().splitlines())
    )
    assert "test_long" in [name for _, name in windows[:2]], f"the long test did not start first: {windows}"


def test_a_timed_test_of_one_run_waits_for_the_tests_of_another_run_sharing_the_lock(tmp_path: Path) -> None:
    """Two pytest runs side by side (nox's guest sessions) given one SHARED_LOCK folder: the second
    run's timed test starts only once the first run's test has ended.

    Run A's test, once B has collected (B's conftest notes it), waits up to 3 s for run B's timed
    test to begin; with the shared lock B cannot begin, so A ends
    first and B's test finds A's end noted. Without the lock B's test begins during A's wait: A sees
    it and ends at once, B finds nothing noted, and this test fails on either side. The tests
    themselves do not see the variable: a pytest run that a test starts (as this file's tests do)
    would otherwise wait, for a timed test, on the lock its own parent test holds.
    """
    from phalanx.testing.processes import Job
    from phalanx.testing.scheduling import SHARED_LOCK

    flags = tmp_path / "flags"
    flags.mkdir()
    for name, test in (
        ("a", "def test_a():\n"
              "    (FLAGS / 'a_in').touch()\n"
              "    deadline = time.monotonic() + 120\n"
              "    while not (FLAGS / 'b_collected').exists():\n"
              "        assert time.monotonic() < deadline\n"
              "        time.sleep(0.05)\n"
              "    until = time.monotonic() + 3\n"
              "    while time.monotonic() < until and not (FLAGS / 'b_started').exists():\n"
              "        time.sleep(0.05)\n"
              "    (FLAGS / 'a_done').touch()\n"),
        ("b", "@pytest.mark.timing\n"
              "def test_b():\n"
              "    (FLAGS / 'b_started').touch()\n"
              "    assert (FLAGS / 'a_done').exists()\n"
              "    assert 'PHALANX_MACHINE_LOCK' not in os.environ  # not passed on to what tests start\n"),
    ):  # fmt: skip
        suite = tmp_path / name
        suite.mkdir()
        hook = "def pytest_collection_finish(session):\n    (FLAGS / 'b_collected').touch()\n" if name == "b" else ""
        header = f"import os, pathlib, time\nimport pytest\nFLAGS = pathlib.Path({str(flags)!r})\n"
        (suite / "conftest.py").write_text(header + hook)
        (suite / f"test_{name}.py").write_text(header + test)
    env = {SHARED_LOCK: str(tmp_path / "lock"), "PYTHONPATH": ""}
    (tmp_path / "lock").mkdir()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", "--dist", "loadgroup",
               "-p", "phalanx.testing.scheduling"]  # fmt: skip
    first = Job([*command, str(tmp_path / "a")], tmp_path, env=env, cwd=tmp_path / "a", name="a", warm=False)
    try:
        deadline = time.monotonic() + 120
        while not (flags / "a_in").exists():  # A's test holds the lock (shared) before B starts
            assert first.poll() is None and time.monotonic() < deadline, first.output()
            time.sleep(0.05)
        second = Job([*command, str(tmp_path / "b")], tmp_path, env=env, cwd=tmp_path / "b", name="b", warm=False)
        try:
            assert second.wait(timeout=120) == 0, second.output()
        finally:
            second.kill()
        assert first.wait(timeout=120) == 0, first.output()
    finally:
        first.kill()
