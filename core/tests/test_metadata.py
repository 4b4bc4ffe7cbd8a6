"""Installed metadata comes from importlib.metadata; the plain-specifier fast path agrees with packaging."""

from __future__ import annotations

import importlib.metadata
import itertools
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from phalanx import _metadata
from phalanx.utilities import installed_version

VERSIONS = ["0.1.0", "1.0", "1.4", "1.4.2", "1.5.0", "2.0", "2.1.0", "2.9.0", "2.13.0+cpu", "99.0", "2.0rc1", "1.0.post1"]
SPECIFIERS = [">=2.1", ">=0.1,<0.2", "==2.9.0", "==2.9", "~=1.4", "~=1.4.0", "!=1.4.2", ">1.4", "<=1.4", "<2,>=1", "==1.*", ""]


@pytest.mark.parametrize(("version", "specifier"), list(itertools.product(VERSIONS, SPECIFIERS)))
def test_satisfies_agrees_with_packaging(version: str, specifier: str) -> None:
    verdict = _metadata.satisfies(version, specifier)
    if verdict is not None:
        assert verdict == SpecifierSet(specifier).contains(version, prereleases=True)


def test_plain_cases_do_not_need_packaging() -> None:
    assert _metadata.satisfies("2.13.0+cpu", ">=2.1") is True
    assert _metadata.satisfies("0.1.0", ">=99") is False
    assert _metadata.satisfies("2.0rc1", ">=1") is None  # pre-release: deferred to packaging


@pytest.mark.parametrize(
    "requirement",
    ["pluggy>=1.3", "pluggy<1", "pluggy>=1.3; python_version < '3'", "pluggy>=1.0.dev0", "packaging[extra]>=1", "phalanx-no-such-dist>=1"],
)
def test_unmet_agrees_with_packaging(requirement: str) -> None:
    req = Requirement(requirement)
    installed = _metadata.version(req.name)
    applies = req.marker is None or req.marker.evaluate({"extra": ""})
    met = not applies or (installed is not None and req.specifier.contains(installed, prereleases=True))
    assert _metadata.unmet(requirement) == (None if met else (req.name, installed))


def test_versions_come_from_importlib_metadata_under_any_spelling() -> None:
    for name in ("torch", "pluggy", "phalanx-core"):
        assert _metadata.version(name) == importlib.metadata.version(name)
        assert installed_version(name.upper().replace("-", "_")) == importlib.metadata.version(name)
    assert installed_version("phalanx-no-such-distribution") is None
    assert {ep.name for ep in _metadata.entry_points("phalanx")} >= {"builtin"}


def test_split_requirement() -> None:
    assert _metadata.split_requirement("torch>=2.1, <3") == ("torch", ">=2.1,<3", "")
    assert _metadata.split_requirement("torch-xla (>=2.1)") == ("torch-xla", ">=2.1", "")
    assert _metadata.split_requirement("pytest; extra == 'test'") is None


def test_import_phalanx_stays_light() -> None:
    code = "import sys, phalanx; print(sorted(m for m in ('torch', 'packaging', 'importlib.metadata') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "[]"
