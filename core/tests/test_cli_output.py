"""`phalanx strategies` fits in 100 columns with variants folded; bad input exits 2 with a suggestion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
    assert suggestion in " ".join(result.stderr.split())  # messages are wrapped at word boundaries


BAD_FACTORY = "def build_model():\n    return None\n"


def _bad_inputs(factory: str, missing: str) -> list[tuple[list[str], str]]:
    """(argv, a piece of the fix) for bad input of every kind the command parses."""
    return [
        (["strategis"], "Fix: use 'strategies'"),
        (["strategies", "--jsn"], "Fix: use '--json'"),
        (["env", "--torhc"], "Fix: use '--torch'"),
        (["doctor", "--strategy", "single_devce"], "Fix: choose a name from `phalanx strategies --all`"),
        (["doctor", "--timeout", "-3"], "Fix: pass e.g. --timeout 120"),
        (["checkpoint", "convrt", "a", "b"], "Fix: use 'convert'"),
        (["plan", f"{factory}:build_modle"], "Fix: name a function that returns the nn.Module"),
        (["plan", f"{missing}:build"], "Fix: pass MODULE:FACTORY"),
        (["plan", "phalanx_no_such_module_at_all:build"], "Fix: check the module path"),
        (["plan", f"{factory}:build_model", "--strategy", "single_devce"], "Fix: choose a name"),
        (["plan", f"{factory}:build_model", "--devices", "x"], "Fix: pass e.g. --devices 8"),
        (["plan", f"{factory}:build_model", "--devices", "0"], "Fix: pass e.g. --devices 8"),
        (["plan", f"{factory}:build_model", "--devcies", "2"], "Fix: use '--devices'"),
        (["plan", f"{factory}:build_model", "--device-memory", "lots"], "Fix:"),
        (["plan"], "Fix: see `phalanx plan --help`"),
    ]


@pytest.mark.parametrize("columns", [200, 60])
def test_every_bad_input_message_fits_the_width_with_the_fix_on_its_own_line(
    columns: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phalanx.cli import main

    monkeypatch.chdir(tmp_path)  # short relative paths: a path longer than the width stays whole on its line
    factory = Path("factories.py")
    factory.write_text(BAD_FACTORY)
    missing = Path("no_such_dir") / "models.py"
    monkeypatch.setenv("COLUMNS", str(columns))  # a wide terminal must still get 100 columns at most
    width = min(columns, 100)
    for argv, fix in _bad_inputs(str(factory), str(missing)):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        out, err = capsys.readouterr()
        assert code == 2 and out == "", (argv, out, err)
        lines = err.splitlines()
        assert max(len(line) for line in lines) <= width, (argv, err)
        fix_lines = [i for i, line in enumerate(lines) if line.lstrip().startswith("Fix:")]
        assert len(fix_lines) == 1, (argv, err)  # exactly one fix, starting its own line
        fix_text = " ".join(line.strip() for line in lines[fix_lines[0] :])
        assert fix_text.startswith(fix), (argv, err)
        error_line = next(line for line in lines if ": error: " in line)
        assert "Fix:" not in error_line, (argv, err)
        if str(missing) in " ".join(err.split()) and len(str(missing)) + 4 < width:
            assert any(str(missing) in line for line in lines), err  # a path is never split


def test_wrapping_keeps_commands_and_paths_whole() -> None:
    from phalanx._cli.messages import format_error

    path = "/very/long/directory/name/that/goes/on/checkpoints/epoch=3-step=1200.ckpt"
    message = (
        f"requires torch-xla>=2.1 to read {path}, which is not installed; "
        "fix: pip install 'torch-xla>=2.1' (then run `phalanx checkpoint convert SRC DST` again)"
    )
    for width in (60, 80, 100):
        text = format_error("phalanx checkpoint convert: error", message, width=width)
        lines = text.splitlines()
        assert all(len(line) <= width for line in lines if path not in line), text
        assert any(path in line for line in lines), text
        assert any("pip install 'torch-xla>=2.1'" in line for line in lines), text
        assert any("`phalanx checkpoint convert SRC DST`" in line for line in lines), text
        assert lines[-1].startswith("  ") and sum(line.startswith("  Fix: ") for line in lines) == 1, text


def test_a_message_without_a_fix_gets_the_default_and_keeps_its_text() -> None:
    from phalanx._cli.messages import format_error, split_fix

    assert split_fix("no fix here") == ("no fix here", None)
    assert split_fix("bad 'x'. Choose 'y'.") == ("bad 'x'.", "choose 'y'.")
    text = format_error("phalanx: error", "something is off", fix="see `phalanx --help`.", width=100)
    assert text == "phalanx: error: something is off\n  Fix: see `phalanx --help`."


def test_cut_strategy_names_keep_their_distinguishing_end_and_stay_unique() -> None:
    from phalanx.planning import short_names

    names = [
        "ddp",
        "ddp_find_unused_parameters_true",
        "ddp_find_unused_parameters_false",
        "deepspeed_stage_3_offload_nvme (+1) *",
        "a_very_long_common_prefix_of_names_x1",
        "a_very_long_common_prefix_of_names_y1",
    ]
    shown = short_names(names, 27)
    assert shown[0] == "ddp"
    assert all(len(text) <= 27 for text in shown) and len(set(shown)) == len(shown), shown
    assert shown[1].endswith("..._true") and shown[2].endswith("..._false"), shown
    assert shown[3].endswith("_nvme (+1) *"), shown
