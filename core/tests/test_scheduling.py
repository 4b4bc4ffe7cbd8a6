"""phalanx.testing.scheduling: under xdist, tests that start processes share one group; the rest do not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

#: Prints each collected test with whether it joined an xdist group (run as a plugin of a pytest
#: that believes it is an xdist worker, so the scheduling plugin acts without starting workers).
PROBE = """
import pytest

def pytest_configure(config):
    config.workerinput = {}

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    for item in items:
        print("GROUP", item.name, [m.args for m in item.iter_markers("xdist_group")])
"""


def test_process_starting_tests_and_their_conftest_fixtures_join_one_group(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent("""
        import subprocess, sys
        import pytest

        @pytest.fixture(scope="session")
        def finished_job():
            return subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).returncode
        """)
    )
    (tmp_path / "test_jobs.py").write_text(
        "import subprocess\n\ndef test_runs_a_job():\n    subprocess.run(['true'])\n"
    )
    (tmp_path / "test_in_process.py").write_text(
        "import pytest\n\n"
        "def test_adds():\n    assert 1 + 1 == 2\n\n"
        "def test_uses_the_job(finished_job):\n    assert finished_job == 0\n\n"
        "@pytest.mark.processes\ndef test_says_so():\n    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "phalanx.testing.scheduling", "-p", "probe", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=120,
    )  # fmt: skip
    groups = dict(line.split(" ", 2)[1:] for line in result.stdout.splitlines() if line.startswith("GROUP "))
    assert groups == {
        "test_runs_a_job": "[('processes',)]",
        "test_adds": "[]",
        "test_uses_the_job": "[('processes',)]",
        "test_says_so": "[('processes',)]",
    }, result.stdout + result.stderr


def test_under_xdist_the_process_starting_tests_run_on_one_worker(tmp_path: Path) -> None:
    """A real ``pytest -n 2 --dist loadgroup`` run: every process-starting test, from three modules,
    runs on the same worker; the in-process tests are not held to it."""
    (tmp_path / "record.py").write_text(
        "import os, pathlib\n\n"
        "def record(name):\n"
        "    pathlib.Path(os.environ['RECORD_DIR'], name).write_text(os.environ['PYTEST_XDIST_WORKER'])\n"
    )
    for index in range(3):
        (tmp_path / f"test_jobs_{index}.py").write_text(
            "import subprocess, sys\nfrom record import record\n\n"
            + "".join(
                f"def test_job_{index}_{case}():\n"
                f"    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
                f"    record('job_{index}_{case}')\n\n"
                for case in range(3)
            )
        )
    (tmp_path / "test_in_process.py").write_text(
        "from record import record\n\n"
        + "".join(f"def test_adds_{case}():\n    record('adds_{case}')\n\n" for case in range(12))
    )
    records = tmp_path / "records"
    records.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
         "-p", "phalanx.testing.scheduling", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=240,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "RECORD_DIR": str(records)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    workers = {path.name: path.read_text() for path in records.iterdir()}
    assert len(workers) == 21, workers
    job_workers = {worker for name, worker in workers.items() if name.startswith("job_")}
    assert len(job_workers) == 1, f"the process-starting tests ran on {sorted(job_workers)}: {workers}"
    assert set(workers.values()) == {"gw0", "gw1"}, f"the in-process tests were not spread: {workers}"


def test_a_kit_test_defined_in_a_process_starting_module_joins_the_group(tmp_path: Path) -> None:
    """A subclass of a conformance kit holds no process call itself: the kit's module, where the
    test functions are defined, does."""
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "kit.py").write_text(
        "import subprocess, sys\n\n"
        "class Kit:\n"
        "    def test_runs_ranks(self):\n"
        "        subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
    )
    (tmp_path / "test_vendor.py").write_text(
        "from kit import Kit\n\nclass TestVendor(Kit):\n    def test_own_check(self):\n        pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-p", "phalanx.testing.scheduling", "-p", "probe", str(tmp_path / "test_vendor.py")],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=120,
    )  # fmt: skip
    groups = dict(line.split(" ", 2)[1:] for line in result.stdout.splitlines() if line.startswith("GROUP "))
    assert groups == {"test_runs_ranks": "[('processes',)]", "test_own_check": "[]"}, result.stdout + result.stderr
