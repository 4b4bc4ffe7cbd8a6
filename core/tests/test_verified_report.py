"""The verified report: `pytest --phalanx-report`, `phalanx plugins --verified`, the committed reports.

The report is written by a real pytest run of the kit (in a subprocess) against ``single_device``
and against a name nothing registers, so both a passing and a failing plugin entry are produced
and read back. The committed reports of this repository's packages are checked for shape, core
version and outcome; the docs hook renders them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from plugin_fixtures import SitePackages

from phalanx import cli
from phalanx.testing import run_command
from phalanx.testing._report import REPORT_FILE, minor, torch_version, validate_report, verdict
from phalanx.version import __version__

ROOT = Path(__file__).resolve().parents[2]
#: Packages whose kit runs in the default environment: each must commit a passing report.
MUST_SHIP = {
    "core": "phalanx",  # the built-ins: single_device and the other kinds' kits in core/tests
    "packages/strategy-ddp": "phalanx_strategy_ddp",
    "packages/strategy-deepspeed": "phalanx_strategy_deepspeed",
    "packages/strategy-fsdp": "phalanx_strategy_fsdp",
    "packages/strategy-model-parallel": "phalanx_strategy_model_parallel",
    "packages/strategy-torchft": "phalanx_strategy_torchft",
    "packages/launcher-ray": "phalanx_ray",
    "packages/strategy-xla": "phalanx_strategy_xla",  # written in the xla session's torch (torch-xla pins it)
    "examples/vendor-strategy": "phalanx_local_sgd",
}

SUITE = """
from phalanx.testing import StrategyConformance


class TestSingleDevice(StrategyConformance):
    strategy = "single_device"
    check_start_methods = False


class TestUnknownName(StrategyConformance):
    strategy = "no_such_strategy"
"""


@pytest.fixture(scope="module")
def written_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("kit")
    (folder / "test_kit.py").write_text(SUITE)
    report = folder / "report.json"
    # Only the two checks that start no process run; the rest must be reported as deselected.
    command = [
        sys.executable,
        "-m",
        "pytest",
        "test_kit.py",
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        "registered or components",
        f"--phalanx-report={report}",
    ]
    result = run_command(command, cwd=folder, timeout=120)
    assert result.returncode == 1, result.output()  # the unregistered name fails its checks
    return json.loads(report.read_text())


def test_report_records_versions_plugins_and_every_check(written_report: dict) -> None:
    assert written_report["core_version"] == __version__ and written_report["torch_version"] == torch_version()
    single, missing = sorted(written_report["plugins"], key=lambda p: p["name"] != "single_device")
    assert (single["plugin"], single["distribution"], single["kind"], single["kit"]) == (
        "builtin",
        "phalanx-core",
        "strategy",
        "StrategyConformance",
    )
    assert (single["passed"], single["failed"], single["deselected"], single["outcome"]) == (2, 0, 8, "passed")
    assert {c["check"]: c["outcome"] for c in single["checks"]}["test_start_method[spawn]"] == "deselected"
    assert (missing["name"], missing["failed"], missing["outcome"]) == ("no_such_strategy", 2, "failed")
    assert missing["plugin"] is None and "no_such_strategy" in missing["error"]
    assert any("no_such_strategy" in p for p in validate_report(written_report))  # no plugin to credit it to


def test_verdict_per_core_and_torch_minor(written_report: dict) -> None:
    passing = {**written_report, "plugins": [p for p in written_report["plugins"] if p["name"] == "single_device"]}
    assert validate_report(passing) == []
    assert verdict("builtin", "phalanx-core", passing)["status"] == "verified"
    assert verdict("other", "phalanx-core", passing)["status"] == "unverified"
    assert verdict("builtin", "phalanx-core", None)["status"] == "unverified"
    old_torch = {**passing, "torch_version": "1.13.1"}
    stale = verdict("builtin", "phalanx-core", old_torch)
    assert stale["status"] == "stale" and "1.13.1" in stale["detail"]
    failed = {**passing, "plugins": [{**passing["plugins"][0], "outcome": "failed"}]}
    assert verdict("builtin", "phalanx-core", failed)["status"] == "failed"


def test_plugins_verified_reads_the_shipped_report(
    site_packages: SitePackages, written_report: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real installed distribution (package folder + dist-info) shipping a report beside its _plugin."""
    package = site_packages.root / "phalanx_fake_verified"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_plugin.py").write_text(
        textwrap.dedent(
            """
            from phalanx import hookimpl

            @hookimpl
            def phalanx_register_strategies(registry):
                registry.register("fake_verified", "phalanx.strategies.single_device:SingleDeviceStrategy", "a test entry")
            """
        )
    )
    info = site_packages.root / "phalanx_fake_verified-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: phalanx-fake-verified\nVersion: 1.0\n\n")
    (info / "entry_points.txt").write_text("[phalanx]\nfake_verified = phalanx_fake_verified._plugin\n")
    entry = {**written_report["plugins"][0], "plugin": "fake_verified", "distribution": "phalanx-fake-verified"}
    (package / REPORT_FILE).write_text(json.dumps({**written_report, "plugins": [entry]}))
    sys.modules.pop("phalanx_fake_verified", None)

    assert cli.main(["plugins", "--verified", "--json"]) == 0
    rows = {row["entry_point"]: row["verified"] for row in json.loads(capsys.readouterr().out)}
    assert rows["fake_verified"]["status"] == "verified", rows["fake_verified"]
    assert rows["fake_verified"]["report"] == str(package / REPORT_FILE)
    assert rows["builtin"]["status"] in {"unverified", "verified"}
    assert cli.main(["plugins", "--verified"]) == 0
    table = capsys.readouterr().out
    assert any(
        line.split()[:3] == ["fake_verified", "phalanx-fake-verified", "1.0"] and "verified" in line
        for line in table.splitlines()
    )


def test_a_plugin_for_another_core_is_incompatible_with_its_range(
    site_packages: SitePackages, capsys: pytest.CaptureFixture[str]
) -> None:
    source = "from phalanx import hookimpl\n"
    site_packages.add("phalanx-fake-future", module_source=source, entry_point="future", requires=("phalanx-core>=9",))
    assert cli.main(["plugins", "--verified", "--json"]) == 0
    verified = {row["entry_point"]: row["verified"] for row in json.loads(capsys.readouterr().out)}["future"]
    assert verified["status"] == "incompatible" and ">=9" in verified["detail"], verified


def test_listing_with_reports_imports_neither_torch_nor_pytest() -> None:
    code = "import sys; from phalanx._cli.listing import verified_rows; verified_rows(); print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'pytest'}))"
    result = run_command([sys.executable, "-c", code], cwd=ROOT, timeout=60).check()
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("folder", sorted(MUST_SHIP))
def test_committed_report_is_well_formed_current_and_passing(folder: str) -> None:
    path = ROOT / folder / "src" / MUST_SHIP[folder] / REPORT_FILE
    assert path.is_file(), f"{path} is missing; regenerate it with `nox -s reports`"
    report = json.loads(path.read_text())
    assert validate_report(report) == []
    assert report["core_version"] == __version__, (
        f"{path} is for phalanx-core {report['core_version']}; run `nox -s reports`"
    )
    assert minor(report["torch_version"]) is not None
    pyproject = (ROOT / folder / "pyproject.toml").read_text()
    for entry in report["plugins"]:
        assert f'name = "{entry["distribution"]}"' in pyproject and f"{entry['plugin']} = " in pyproject
        assert entry["outcome"] == "passed" and entry["failed"] == 0 and entry["passed"] > 0, entry


def _load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plugin_index", ROOT / "docs" / "_ext" / "plugin_index.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_hook_renders_one_row_per_plugin_and_check() -> None:
    hook = _load_hook()
    paths = hook.report_paths(ROOT)
    assert {p.parent.name for p in paths} >= set(MUST_SHIP.values())
    page = (ROOT / "docs" / "plugin-index.md").read_text()
    markdown = hook.on_page_markdown(page, SimpleNamespace(file=SimpleNamespace(src_uri="plugin-index.md")), None, None)
    assert hook.MARKER not in markdown
    reports = [json.loads(p.read_text()) for p in paths]
    checks = sum(len(e["checks"]) for r in reports for e in r["plugins"])
    rows = [line for line in markdown.split("## Checks")[1].splitlines() if line.startswith("| `")]
    assert len(rows) == checks
    assert "| `ddp_fork` | `test_resume_matches_uninterrupted` | passed |" in markdown
    other = hook.on_page_markdown("text", SimpleNamespace(file=SimpleNamespace(src_uri="index.md")), None, None)
    assert other == "text"
