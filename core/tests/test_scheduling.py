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
