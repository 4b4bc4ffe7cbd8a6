"""The `phalanx` command: JSON shapes, help texts, tables that fit, bad input, env, doctor."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
from plugin_fixtures import SitePackages

from phalanx import cli

STRATEGY_KEYS = {"name", "description", "plugin", "distribution", "version", "target", "available", "reason"}
PLUGIN_KEYS = {"entry_point", "value", "distribution", "version", "status", "reason", "hooks", "provides"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "phalanx.cli", *args], capture_output=True, text=True, timeout=60)


def test_strategies_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["strategies", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(set(row) == STRATEGY_KEYS for row in rows)
    single = next(row for row in rows if row["name"] == "single_device")
    assert single["distribution"] == "phalanx-core" and single["available"] is True
    assert single["target"] == "phalanx.strategies.single_device:SingleDeviceStrategy"


def test_plugins_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plugins", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert all(set(r) == PLUGIN_KEYS for r in records)
    builtin = next(r for r in records if r["entry_point"] == "builtin")
    assert builtin["status"] == "loaded"
    assert builtin["provides"]["precision"] == [
        "32-true",
        "64-true",
        "16-mixed",
        "bf16-mixed",
        "16-true",
        "bf16-true",
        "float8",
    ]


@pytest.mark.parametrize(
    "args", [[], ["--help"], ["strategies", "--help"], ["plugins", "--help"], ["env", "--help"], ["doctor", "--help"]]
)
def test_help_texts(args: list[str]) -> None:
    result = _run(*args)
    assert result.returncode == 0
    assert "usage: phalanx" in result.stdout


def test_listing_does_not_import_torch() -> None:
    code = (
        "import sys, phalanx.cli; phalanx.cli.main(['strategies', '--json']); phalanx.cli.main(['plugins']);"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("flag", [[], ["--torch"]])
def test_env_reports_versions_and_backends(flag: list[str]) -> None:
    import torch

    result = _run("env", *flag)
    assert result.returncode == 0, result.stderr
    assert f"torch          {torch.__version__}" in result.stdout
    assert "gloo" in result.stdout and "builtin" in result.stdout
    assert f"python         {platform.python_version()} ({sys.executable})" in result.stdout


def test_env_shows_the_venv_interpreter_not_the_base_prefix() -> None:
    result = _run("env")
    line = next(line for line in result.stdout.splitlines() if line.startswith("python "))
    assert sys.executable in line and "<prefix>" not in line
    if sys.prefix != sys.base_prefix:  # a venv: its own python, not the one it was made from
        assert line.endswith(f"({sys.executable})") and sys.prefix in line


def test_env_does_not_import_torch() -> None:
    code = "import sys, phalanx.cli; phalanx.cli.main(['env']); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_broken_plugin_is_shown_with_its_reason(site_packages: SitePackages) -> None:
    site_packages.add("phalanx-fake-cli-broken", module_source="import phalanx_this_does_not_exist\n")
    result = _run("strategies")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # long reasons are wrapped to the terminal's width
    assert "phalanx-fake-cli-broken" in text and "failed" in text
    assert "No module named 'phalanx_this_does_not_exist'" in text
    plugins = {p["entry_point"]: p for p in json.loads(_run("plugins", "--json").stdout)}
    assert plugins["phalanx-fake-cli-broken"]["status"] == "failed"
