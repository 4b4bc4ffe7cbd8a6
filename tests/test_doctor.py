"""`phalanx doctor` with every in-repo plugin installed: each strategy passes or is skipped with a reason.

The doctor runs as a user would (a subprocess, its own fresh processes per check), so this is the
machine-level proof the README promises: a plugin whose default fit breaks here, or that the
doctor's one Module cannot serve (``model_parallel`` refusing an unsplit model, issue 27), fails
this test with the doctor's own explanation. One name per plugin (``--strategy``; the variants of
a name share its code path and have their own package tests), ``model_parallel`` always among
them: about 2-3 minutes on 2 CPU cores, most of it process start-up (torch, deepspeed imports).
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


def _one_name_per_plugin(listed: dict[str, dict[str, object]]) -> list[str]:
    """The first name each plugin lists (its base name), plus ``model_parallel``, the one issue 27 was about."""
    chosen: dict[object, str] = {}
    for name, entry in listed.items():
        chosen.setdefault(entry["plugin"], name)
    names = list(chosen.values())
    return names if "model_parallel" in names or "model_parallel" not in listed else [*names, "model_parallel"]


def test_doctor_passes_or_skips_every_installed_strategy() -> None:
    listed = {str(entry["name"]): entry for entry in _strategies()}
    assert "model_parallel" in listed, "the integration session installs every in-repo package"
    names = _one_name_per_plugin(listed)
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "phalanx.cli",
            "doctor",
            *(a for n in names for a in ("--strategy", n)),
            "--timeout",
            "240",
        ],
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
    assert sorted(checks) == sorted(names), out
    # Every plugin that registers a strategy was exercised.
    assert {listed[name]["plugin"] for name in checks} == {entry["plugin"] for entry in listed.values()}, out
    for name, (status, detail) in checks.items():
        if status == "skipped":
            assert listed[name]["available"] is False and detail.strip(), f"{name} skipped without a reason:\n{out}"
        else:
            assert "loss" in detail, out
    if listed["model_parallel"]["available"]:  # torch>=2.6: it must train, split for real, not trained whole
        status, detail = checks["model_parallel"]
        assert status == "pass" and "tensor parallel x2" in detail and "parameters split" in detail, out
    passed = sum(status == "pass" for status, _ in checks.values()) + 1
    skipped = sum(status == "skipped" for status, _ in checks.values())
    assert out.strip().endswith(f"{passed} passed, 0 failed, {skipped} skipped"), out
