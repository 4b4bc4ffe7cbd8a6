"""The fast metadata reader agrees with importlib.metadata and packaging, or defers to them."""

from __future__ import annotations

import importlib.metadata
import itertools

import pytest
from packaging.specifiers import SpecifierSet

from phalanx import _metadata

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


def test_versions_and_entry_points_match_importlib_metadata() -> None:
    for name in ("torch", "pluggy", "phalanx-core"):
        assert _metadata.version(name) == importlib.metadata.version(name)
    ours = {(ep.name, ep.value) for ep in _metadata.entry_points("phalanx")}
    theirs = {(ep.name, ep.value) for ep in importlib.metadata.entry_points(group="phalanx")}
    assert ours == theirs
    assert _metadata.version("phalanx-no-such-distribution") is None


def test_split_requirement() -> None:
    assert _metadata.split_requirement("torch>=2.1, <3") == ("torch", ">=2.1,<3", "")
    assert _metadata.split_requirement("torch-xla (>=2.1)") == ("torch-xla", ">=2.1", "")
    assert _metadata.split_requirement("pytest; extra == 'test'") is None
