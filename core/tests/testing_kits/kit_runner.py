"""Run a conformance kit on deliberately buggy plugins in a pytest subprocess and read each check's outcome.

Each negative control is a real plugin with one real bug, in a ``buggy_*.py`` module next to this
file. The module and a test file subclassing the kit are written to a fresh folder and pytest runs
there in its own process (an in-process ``pytester.inline_run`` would have to import torch a
second time), through :func:`phalanx.testing.run_command`, which kills whatever it left. The
outcomes come from the run's JUnit XML report; a check counts as failed when any of its phases
(fixture setup included) failed.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from phalanx.testing import run_command

__all__ = ["Outcome", "assert_fails", "assert_passes", "run_kit"]

HERE = Path(__file__).parent


@dataclass
class Outcome:
    outcome: str
    text: str


def run_kit(folder: Path, module: str, source: str, *selected: str, timeout: float = 240.0) -> dict[str, Outcome]:
    """Run ``source`` (a test file using the plugins of ``<module>.py``); ``selected`` are ``Class::test`` ids.

    Returns ``"Class::test"`` -> its outcome (passed, failed, skipped) and the failure text.
    """
    shutil.copy(HERE / f"{module}.py", folder / f"{module}.py")
    name = f"test_kit_on_{module}"
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    (folder / "pytest.ini").write_text("[pytest]\n")
    ids = [f"{name}.py::{item}" for item in selected] or [f"{name}.py"]
    report = folder / "report.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "-q",
        f"--junitxml={report}",
        *ids,
    ]
    result = run_command(command, cwd=folder, timeout=timeout)
    result.check_leftovers()
    assert report.exists(), f"pytest wrote no report\n{result.output()}"
    outcomes: dict[str, Outcome] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        failures = [child for child in case if child.tag in ("failure", "error")]
        if failures:
            outcomes[key] = Outcome("failed", "\n".join(f"{c.get('message', '')}\n{c.text or ''}" for c in failures))
        elif any(child.tag == "skipped" for child in case):
            outcomes[key] = Outcome("skipped", "")
        else:
            outcomes[key] = Outcome("passed", "")
    return outcomes


def assert_fails(outcomes: dict[str, Outcome], check: str, because: str) -> None:
    """``check`` failed, and its failure text contains ``because`` (the kit's reason, not any error)."""
    assert check in outcomes, f"{check} did not run; ran {sorted(outcomes)}"
    got = outcomes[check]
    assert got.outcome == "failed", f"the kit passed the buggy plugin: {check} {got.outcome}"
    assert because in got.text, f"{check} failed for another reason than {because!r}:\n{got.text[-3000:]}"


def assert_passes(outcomes: dict[str, Outcome], check: str) -> None:
    """``check`` ran and passed."""
    assert check in outcomes and outcomes[check].outcome == "passed", f"{check}: {outcomes.get(check)}"
