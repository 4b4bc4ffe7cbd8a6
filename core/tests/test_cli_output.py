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
    assert suggestion in " ".join(result.stderr.split())  # messages are wrapped at word boundaries


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


def _report(*, activations: bool) -> object:
    """A plan of two strategies, one offloading, built by hand: no plugin or model needed."""
    from phalanx.memory import MemoryEstimate, ModelSummary, ParameterShape
    from phalanx.planning import PlanReport, PlanRow

    summary = ModelSummary(
        (ParameterShape("w", (1000, 1000), "float32", True),), activation_bytes=7 if activations else None
    )
    big = MemoryEstimate(2**30, 2**30, 2 * 2**30, 7 if activations else None, 3 * 2**20)
    off = MemoryEstimate(0, 0, 0, 7 if activations else None, 5 * 2**20, cpu=3 * 2**30, nvme=2**30)
    rows = (
        PlanRow("ddp (+11)", big, False),
        PlanRow("deepspeed_stage_3_offload_nvme", off, True),
    )
    return PlanReport(
        summary, rows, devices=8, num_nodes=1, precision="32-true", optimizer="adamw", device_memory=2**30
    )


@pytest.mark.parametrize("activations", [False, True])
@pytest.mark.parametrize("width", [100, 80, 60, 50])
def test_a_narrow_plan_table_drops_detail_columns_never_total_or_fits(width: int, activations: bool) -> None:
    from phalanx.planning import render

    lines = render(_report(activations=activations), width=width).splitlines()  # type: ignore[arg-type]
    assert max(len(line) for line in lines) <= width, "\n".join(lines)
    header = next(line for line in lines if line.startswith("STRATEGY"))
    titles = header.split()
    assert titles[-3:] == ["TOTAL", "FITS", "HOST"], header
    ddp = next(line for line in lines if line.startswith("ddp (+11)"))
    nvme = next(line for line in lines if line.startswith("deepspee"))
    assert ddp.split()[-2:] == ["4GiB", "NO"], ddp  # 1 + 1 + 2 GiB (+ 3 MiB), rounded
    assert nvme.split()[-3:] == ["yes", "cpu:3GiB", "nvme:1GiB"], nvme
    assert nvme.split()[0].endswith("_nvme"), nvme  # cut in the middle, end kept
    hidden = [t for t in ("PARAMS", "GRADS", "OPTIM", "ACTIV", "OTHER") if t not in titles]
    note = " ".join(line.strip() for line in lines if "not shown in" in line or line.startswith("  "))
    shown_hidden = [t for t in hidden if t != "ACTIV" or activations]
    if shown_hidden:
        assert f"{', '.join(shown_hidden)} not shown in {width} columns" in note, "\n".join(lines)
    else:
        assert "not shown in" not in note
    if width == 100:
        assert hidden == [], header  # the full table fits 100 columns
    assert any(line.startswith("(+N): N more names with the same estimate") for line in lines), "\n".join(lines)
    assert any(line.startswith("OTHER:") for line in lines)
    assert lines[0].startswith("1M parameters; 8 ranks (1 x 8);"), lines[0]


def test_a_reader_that_leaves_early_stops_the_command_quietly() -> None:
    """`phalanx env | head -1`: the pipe closes before the command has written; no traceback, status 141."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "phalanx.cli", "env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    errors = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, errors
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors
