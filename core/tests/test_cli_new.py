"""`phalanx new`: the generated package installs, is listed, passes its kit, and its kit can fail.

The end-to-end test does what a vendor does, for real: generate into an empty folder, ``pip
install`` it (with ``--target`` into a throw-away folder put on PYTHONPATH, so the dev torch and
core are reused and the test environment is untouched), list it with ``phalanx strategies``, run
its own pytest, ship the report and see ``phalanx plugins --verified`` call it verified. Then the
one method the scaffold marks is emptied and the kit must fail the package.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from phalanx import cli
from phalanx._cli.new import KINDS, available_kinds, core_requirement, render
from phalanx.testing import run_command
from phalanx.version import __version__

NAME = "scaffold_sgd"


def _env(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}


def test_core_requirement_is_the_running_cores_minor() -> None:
    assert core_requirement("0.1.0") == "phalanx-core>=0.1,<0.2"
    assert core_requirement("1.4.2") == "phalanx-core>=1.4,<2"
    assert __version__ in SpecifierSet(core_requirement().removeprefix("phalanx-core"))


def test_strategy_files_are_complete_and_mark_one_method() -> None:
    assert "strategy" in available_kinds()
    files = render("strategy", NAME)
    module = f"phalanx_{NAME}"
    assert sorted(files) == sorted(
        [
            "README.md",
            "pyproject.toml",
            f"src/{module}/__init__.py",
            f"src/{module}/_plugin.py",
            f"src/{module}/strategy.py",
            "tests/conftest.py",
            f"tests/test_{NAME}_conformance.py",
        ]
    )
    pyproject = files["pyproject.toml"]
    assert f'{NAME} = "{module}._plugin"' in pyproject.split("[project.entry-points.phalanx]")[1]
    assert f'"{core_requirement()}"' in pyproject
    strategy = files[f"src/{module}/strategy.py"]
    assert strategy.count("FILL IN") == 1 and "class ScaffoldSgdStrategy(ParallelStrategy)" in strategy
    assert "def post_backward" in strategy.split("FILL IN")[0].splitlines()[-2]
    assert "import torch" not in files[f"src/{module}/_plugin.py"]  # listing must stay torch-free
    assert "post_backward" in files["README.md"] and "check_start_methods" in files["README.md"]
    for path, text in files.items():
        if path.endswith(".py"):
            compile(text, path, "exec")  # every generated module is valid Python


@pytest.mark.parametrize("kind", sorted(set(available_kinds()) - {"strategy"}))
def test_every_kind_marks_its_one_method_and_runs_its_kit(kind: str) -> None:
    spec = KINDS[kind]
    files = render(kind, "probe")
    source = files[f"src/phalanx_probe/{spec.class_module}.py"]
    assert source.count("FILL IN") == 1 and f"def {spec.method}(" in source.split("FILL IN")[0].splitlines()[-2]
    plugin = files["src/phalanx_probe/_plugin.py"]
    assert f"def {spec.hook}(" in plugin and "import torch" not in plugin
    test = files["tests/test_probe_conformance.py"]
    assert f"({spec.kit}):" in test and f'{spec.kit_attribute} = "probe"' in test
    for path, text in files.items():
        if path.endswith(".py"):
            compile(text, path, "exec")


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("Foo-Bar", "not a lowercase Python identifier"),
        ("class", "not a lowercase Python identifier"),
        ("single_device", "already a strategy registered by phalanx-core"),
        ("builtin", "already the entry point of phalanx-core"),
    ],
)
def test_bad_name_is_one_error_with_a_suggestion(
    name: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["new", "strategy", name, str(tmp_path / "pkg")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("error") == 1 and fragment in err, err
    suggestion = err.split("Fix: use '")[1].split("'")[0]
    assert suggestion != name and suggestion.isidentifier()
    assert not (tmp_path / "pkg").exists()


def test_non_empty_dir_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "pkg"
    target.mkdir()
    (target / "README.md").write_text("mine\n")
    assert cli.main(["new", "strategy", NAME, str(target)]) == 2
    assert "never overwrites" in capsys.readouterr().err
    assert [p.name for p in target.iterdir()] == ["README.md"] and (target / "README.md").read_text() == "mine\n"


def _install(packages: list[Path], site: Path, cwd: Path) -> None:
    isolation = ["--no-build-isolation"] if find_spec("hatchling") else []
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation, "--target", str(site)]
    run_command([*pip, *map(str, packages)], cwd=cwd, timeout=180).check()


@pytest.mark.timeout(300)
def test_other_kinds_install_are_listed_and_pass_their_kits(tmp_path: Path) -> None:
    """Every non-strategy kind at once: one install, one listing, one pytest run over the packages."""
    kinds = sorted(set(available_kinds()) - {"strategy"})
    packages = [tmp_path / kind for kind in kinds]
    for kind, package in zip(kinds, packages):
        assert cli.main(["new", kind, f"new_{kind.replace('-', '_')}", str(package)]) == 0
    site = tmp_path / "site"
    _install(packages, site, tmp_path)
    env = _env(site)
    listed = run_command([sys.executable, "-m", "phalanx.cli", "plugins", "--json"], cwd=tmp_path, env=env, timeout=60)
    records = {r["entry_point"]: r for r in json.loads(listed.check().stdout)}
    for kind in kinds:
        name = f"new_{kind.replace('-', '_')}"
        provided = [n for names in records[name]["provides"].values() for n in names]
        assert records[name]["status"] == "loaded" and name in provided, records[name]
    report = tmp_path / "report.json"
    command = [
        sys.executable,
        "-m",
        "pytest",
        *map(str, packages),
        "-q",
        "-p",
        "no:cacheprovider",
        f"--phalanx-report={report}",
    ]
    result = run_command(command, cwd=tmp_path, env=env, timeout=240)
    assert result.returncode == 0, result.output()
    suites = {p["kind"]: p for p in json.loads(report.read_text())["plugins"]}
    assert sorted(suites) == kinds
    assert all(s["outcome"] == "passed" and s["failed"] == 0 and s["passed"] >= 3 for s in suites.values()), suites


@pytest.mark.timeout(420)
def test_generated_package_installs_is_listed_passes_and_can_fail(tmp_path: Path) -> None:
    package, site = tmp_path / "pkg", tmp_path / "site"
    package.mkdir()  # an empty folder is fine
    assert cli.main(["new", "strategy", NAME, str(package)]) == 0

    _install([package], site, tmp_path)
    env = _env(site)

    listed = run_command(
        [sys.executable, "-m", "phalanx.cli", "strategies", "--json"], cwd=tmp_path, env=env, timeout=60
    )
    row = next(r for r in json.loads(listed.check().stdout) if r["name"] == NAME)
    assert row["distribution"] == "phalanx-scaffold-sgd" and row["available"] is True, row

    report = tmp_path / "report.json"
    kit = [sys.executable, "-m", "pytest", str(package), "-q", "-p", "no:cacheprovider", f"--phalanx-report={report}"]
    result = run_command(kit, cwd=package, env=env, timeout=300)
    assert result.returncode == 0, result.output()
    # Speed comes from leaving out the start-method check (3 launches): ~25 s on an idle 2-core machine.
    (suite,) = json.loads(report.read_text())["plugins"]
    assert (suite["name"], suite["distribution"], suite["outcome"]) == (NAME, "phalanx-scaffold-sgd", "passed")
    assert suite["passed"] == 7 and suite["failed"] == 0 and suite["deselected"] == 3, suite

    installed = site / f"phalanx_{NAME}"
    shutil.copy(report, installed / "phalanx-report.json")
    verified = run_command(
        [sys.executable, "-m", "phalanx.cli", "plugins", "--verified", "--json"], cwd=tmp_path, env=env, timeout=60
    )
    ours = next(r for r in json.loads(verified.check().stdout) if r["entry_point"] == NAME)
    assert ours["verified"]["status"] == "verified", ours["verified"]

    # Leave the marked method empty: replicas drift apart and the kit must say so.
    source = installed / "strategy.py"
    body = source.read_text()
    source.write_text(body.replace("        if self.world_size == 1:\n            return\n", "        return\n", 1))
    assert source.read_text() != body
    broken = run_command([*kit[:-1], "-k", "fit_matches"], cwd=package, env=env, timeout=300)
    assert broken.returncode != 0 and "from plain PyTorch" in broken.stdout, broken.output()
