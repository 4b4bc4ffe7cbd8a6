"""`phalanx strategies` fits in 100 columns with variants folded; bad input exits 2 with a suggestion."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from plugin_fixtures import SitePackages

WIDE_PLUGIN = """
from phalanx import hookimpl

LONG = "A strategy whose description goes on " + "and on " * 30

@hookimpl
def phalanx_register_strategies(registry):
    target = "phalanx_fake_wide_impl:Wide"
    registry.register("fakewide", target, LONG, mode="a")
    registry.register("fakewide_find_unused_parameters_true", target, LONG, mode="a", find_unused=True)
    registry.register("fakewide_find_unused_parameters_false", target, LONG, mode="a", find_unused=False)
    registry.register("fakewide_spawn", target, "Another base: its init params differ", mode="b")
"""


def _run(*args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "phalanx.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.fixture
def wide(site_packages: SitePackages) -> SitePackages:
    site_packages.add("phalanx-fake-wide", module_source=WIDE_PLUGIN)
    return site_packages


def test_variants_fold_under_their_base_and_lines_fit_100_columns(wide: SitePackages) -> None:
    result = _run("strategies")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    names = [line.split("  ")[0] for line in lines[1:] if line and not line.startswith((" ", "("))]
    assert "fakewide (+2)" in names and "fakewide_spawn" in names
    assert not any(name.startswith("fakewide_find_unused") for name in names)
    row = next(line for line in lines if line.startswith("fakewide (+2)"))
    assert row.endswith("...") and "A strategy whose description" in row


def test_narrow_terminal_narrows_the_table(wide: SitePackages) -> None:
    lines = _run("strategies", columns=80).stdout.splitlines()
    assert max(len(line) for line in lines) <= 80


def test_all_lists_every_name_and_json_is_complete(wide: SitePackages) -> None:
    every = _run("strategies", "--all").stdout
    assert max(len(line) for line in every.splitlines()) <= 100
    for name in ("fakewide", "fakewide_find_unused_parameters_true", "fakewide_find_unused_parameters_false"):
        assert any(line.split("  ")[0] == name for line in every.splitlines())
    rows = {row["name"]: row for row in json.loads(_run("strategies", "--json").stdout)}
    assert rows["fakewide_find_unused_parameters_true"]["description"].startswith("A strategy whose description")
    assert len(rows["fakewide"]["description"]) > 100


def test_plugins_table_fits(wide: SitePackages) -> None:
    result = _run("plugins")
    assert result.returncode == 0
    assert max(len(line) for line in result.stdout.splitlines()) <= 100


@pytest.mark.parametrize(
    ("args", "usage", "suggestion"),
    [
        (["strategis"], "usage: phalanx [-h]", "closest match: 'strategies'"),
        (["strategies", "--jsn"], "usage: phalanx strategies", "closest match: '--json'"),
        (["env", "--torhc"], "usage: phalanx env", "closest match: '--torch'"),
        (["doctor", "--strategy", "single_devce"], "usage: phalanx doctor", "closest match: 'single_device'"),
        (["doctor", "--strategy", "nosuch"], "usage: phalanx doctor", "unknown strategy 'nosuch'; closest match: '"),
        (["doctor", "--timeout", "-3"], "usage: phalanx doctor", "not a positive number of seconds"),
        (["checkpoint", "convrt", "a", "b"], "usage: phalanx checkpoint", "closest match: 'convert'"),
    ],
)
def test_bad_input_prints_usage_and_the_closest_match(args: list[str], usage: str, suggestion: str) -> None:
    result = _run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(usage), result.stderr
    assert suggestion in result.stderr
