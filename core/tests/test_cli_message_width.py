"""Every error the ``phalanx`` command prints fits 100 columns (or a narrower terminal), fix on its own line.

A newcomer measured ``phalanx strategis`` at 167 columns and a bad plan factory at 222: messages
are written as one long string where the bad value is found, and only ``_cli/messages.py`` wraps
them. These tests run the command's real bad inputs (in-process through ``main`` for every kind,
and once through a fresh interpreter, as a user's shell runs it) and measure every line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BAD_FACTORY = "def build_model():\n    return None\n"


def _bad_inputs(factory: str, missing: str) -> list[tuple[list[str], str]]:
    """(argv, how the fix line starts) for bad input of every kind the command parses."""
    return [
        (["bogus"], "Fix: use '"),  # unknown command: the closest one is offered
        (["strategis"], "Fix: use 'strategies'"),
        (["strategies", "--jsn"], "Fix: use '--json'"),
        (["env", "--torhc"], "Fix: use '--torch'"),
        (["doctor", "--strategy", "single_devce"], "Fix: choose a name from `phalanx strategies --all`"),
        (["doctor", "--strategy", "horovod"], "Fix: choose a name from `phalanx strategies --all`"),
        (["doctor", "--timeout", "-3"], "Fix: pass e.g. --timeout 120"),
        (["checkpoint", "convrt", "a", "b"], "Fix: use 'convert'"),
        (["checkpoint", "convert", "no_such_run/last.ckpt", "out.pt"], "Fix: pass the checkpoint file"),
        (["plan", f"{factory}:build_modle"], "Fix: name a function that returns the nn.Module"),
        (["plan", f"{factory}:build_model"], "Fix:"),  # returns None, not an nn.Module
        (["plan", f"{missing}:build"], "Fix: pass MODULE:FACTORY"),
        (["plan", "phalanx_no_such_module_at_all:build"], "Fix: check the module path"),
        (["plan", f"{factory}:build_model", "--strategy", "single_devce"], "Fix: choose a name"),
        (["plan", f"{factory}:build_model", "--devices", "x"], "Fix: pass e.g. --devices 8"),
        (["plan", f"{factory}:build_model", "--devices", "0"], "Fix: pass e.g. --devices 8"),
        (["plan", f"{factory}:build_model", "--devcies", "2"], "Fix: use '--devices'"),
        (["plan", f"{factory}:build_model", "--device-memory", "lots"], "Fix:"),
        (["plan", f"{factory}:build_model", "--device-memory", "24 gigs"], "Fix:"),
        (["plan"], "Fix: see `phalanx plan --help`"),
    ]


def _check(argv: list[str], fix: str, code: int, out: str, err: str, width: int) -> None:
    assert code == 2 and out == "", (argv, out, err)
    lines = err.splitlines()
    # Only a single word (a long path) may overflow: it is never split, so it can be copied whole.
    too_long = [line for line in lines if len(line) > width and " " in line.strip()]
    assert not too_long, (argv, width, too_long)
    fix_lines = [i for i, line in enumerate(lines) if line.lstrip().startswith("Fix:")]
    assert len(fix_lines) == 1, (argv, err)  # exactly one fix, starting its own line
    assert " ".join(line.strip() for line in lines[fix_lines[0] :]).startswith(fix), (argv, err)
    error_line = next(line for line in lines if ": error: " in line)
    assert "Fix:" not in error_line, (argv, err)
    assert lines.index(error_line) < fix_lines[0], (argv, err)  # what is wrong, then what to do


@pytest.mark.parametrize("columns", [300, 100, 60])
def test_every_bad_input_message_fits_the_width_with_the_fix_on_its_own_line(
    columns: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phalanx.cli import main

    monkeypatch.chdir(tmp_path)  # short relative paths: a path longer than the width stays whole on its line
    Path("factories.py").write_text(BAD_FACTORY)
    missing = str(Path("no_such_dir") / "models.py")
    monkeypatch.setenv("COLUMNS", str(columns))  # a wide terminal must still get 100 columns at most
    width = min(columns, 100)
    for argv, fix in _bad_inputs("factories.py", missing):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        out, err = capsys.readouterr()
        _check(argv, fix, code, out, err, width)
        if missing in " ".join(err.split()):
            assert any(missing in line for line in err.splitlines()), err  # a path is never split


def test_a_missing_checkpoint_says_it_does_not_exist_and_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phalanx.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["checkpoint", "convert", "run/last.ckpt", "out.pt"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "checkpoint 'run/last.ckpt' does not exist" in err and repr(str(tmp_path)) in err, err
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["strategis"], "closest match: 'strategies'"),  # measured at 167 columns before the wrapping
        (["plan", "factories.py:build_modle"], "no callable 'build_modle'"),  # measured at 222
    ],
)
def test_the_console_command_wraps_in_a_wide_terminal(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "factories.py").write_text(BAD_FACTORY)
    env = {**os.environ, "COLUMNS": "300"}
    result = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert max(len(line) for line in result.stderr.splitlines()) <= 100, result.stderr
    assert needle in " ".join(result.stderr.split()), result.stderr
    assert sum(line.startswith("  Fix: ") for line in result.stderr.splitlines()) == 1, result.stderr
