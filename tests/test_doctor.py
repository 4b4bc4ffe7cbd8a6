"""`phalanx doctor` with every in-repo plugin installed: each strategy passes or is skipped with a reason.

The doctor runs as a user would (a subprocess, its own fresh processes per check), so this is the
machine-level proof the README promises: a plugin whose default fit breaks here, or that the
doctor's one Module cannot serve (``model_parallel`` refusing an unsplit model, issue 27), fails
this test with the doctor's own explanation. One fit per base name: about 4-5 minutes on 2 CPU
cores, most of it process start-up (torch, deepspeed imports).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

DOCTOR_TIMEOUT = 600
pytestmark = pytest.mark.timeout(DOCTOR_TIMEOUT + 60)

_LINE = re.compile(
    r"^  (?P<name>\S+(?: all-reduce)?)\s+(?P<status>pass|fail|skipped)\s+(?P<seconds>[\d.]+)s  (?P<detail>.*)$"
)


def _strategies() -> list[dict[str, object]]:
    raw = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "strategies", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return list(json.loads(raw.stdout))


def test_doctor_passes_or_skips_every_installed_strategy() -> None:
    listed = {str(entry["name"]): entry for entry in _strategies()}
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "doctor", "--timeout", "240"],
        capture_output=True,
        text=True,
        timeout=DOCTOR_TIMEOUT,
        env=env,
        start_new_session=True,
    )
    out = done.stdout
    checks: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        if match := _LINE.match(line):
            name = match["name"]
            checks[name] = (match["status"], match["detail"])
        elif checks and line.startswith(" " * 20):  # the doctor wraps a long detail under itself
            checks[name] = (checks[name][0], f"{checks[name][1]} {line.strip()}")
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert checks.pop("gloo all-reduce")[0] == "pass", out
    failed = {name: detail for name, (status, detail) in checks.items() if status == "fail"}
    assert not failed, out
    assert set(checks) <= set(listed), out
    # Every plugin that registers a strategy was exercised (the doctor checks one name per base).
    assert {listed[name]["plugin"] for name in checks} == {entry["plugin"] for entry in listed.values()}, out
    for name, (status, detail) in checks.items():
        if status == "skipped":
            assert listed[name]["available"] is False and detail.strip(), f"{name} skipped without a reason:\n{out}"
        else:
            assert "loss" in detail, out
    if "model_parallel" in checks and checks["model_parallel"][0] == "pass":
        assert "tensor parallel x2" in checks["model_parallel"][1], out  # split for real, not trained whole
    passed = sum(status == "pass" for status, _ in checks.values()) + 1
    skipped = sum(status == "skipped" for status, _ in checks.values())
    assert out.strip().endswith(f"{passed} passed, 0 failed, {skipped} skipped"), out
