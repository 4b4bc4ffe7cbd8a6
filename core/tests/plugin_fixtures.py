"""Build real installed distributions (dist-info folders on sys.path) for plugin-discovery tests.

A wheel installed by pip is a package folder plus a ``*.dist-info`` folder in a directory on
``sys.path``; writing exactly that into a temporary directory gives discovery real distributions to
find without touching the test environment.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx import discovery

__all__ = ["SitePackages", "site_packages"]


class SitePackages:
    """A throw-away site-packages directory that the current process and subprocesses see."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(
        self,
        name: str,
        *,
        module_source: str,
        entry_point: str | None = None,
        version: str = "1.0",
        requires: tuple[str, ...] = ("phalanx-core",),
    ) -> str:
        """Install distribution ``name`` whose module ``phalanx_<name>`` holds ``module_source``."""
        module = name.replace("-", "_")
        (self.root / f"{module}.py").write_text(textwrap.dedent(module_source))
        info = self.root / f"{module}-{version}.dist-info"
        info.mkdir()
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Requires-Dist: {req}" for req in requires]
        (info / "METADATA").write_text("\n".join(lines) + "\n\n")
        (info / "entry_points.txt").write_text(f"[phalanx]\n{entry_point or name} = {module}\n")
        discovery._reset_for_tests()
        return module


@pytest.fixture
def site_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SitePackages]:
    """A fresh directory at the front of sys.path (and PYTHONPATH for subprocesses)."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))
    discovery._reset_for_tests()
    yield SitePackages(root)
    for key in [k for k in sys.modules if k.startswith("phalanx_fake")]:
        del sys.modules[key]
    discovery._reset_for_tests()
