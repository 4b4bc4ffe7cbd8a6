"""A small, fast reader of installed distribution metadata.

``importlib.metadata`` costs ~70 ms just to import (email, zipfile, pathlib, ...), half the time
budget of ``phalanx strategies``. Listing needs three facts only: entry points of one group,
versions, and ``Requires-Dist`` lines. This module reads them straight from the ``*.dist-info`` /
``*.egg-info`` folders on ``sys.path``, with the same first-on-path-wins rule the import system
uses. It handles plain folders only; for anything else (zipped eggs) callers fall back to
``importlib.metadata``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

__all__ = ["Distribution", "EntryPoint", "canonical_name", "distributions", "entry_points", "find", "version"]


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: lower case, runs of ``-_.`` become one ``-``."""
    out: list[str] = []
    for ch in name.lower():
        if ch in "-_.":
            if not out or out[-1] != "-":
                out.append("-")
        else:
            out.append(ch)
    return "".join(out)


@dataclass(frozen=True)
class EntryPoint:
    """One ``name = module:attr`` line of an entry-point group."""

    name: str
    value: str
    group: str
    dist: Distribution

    def load(self) -> object:
        """Import the module (and attribute) the entry point names."""
        import importlib

        module_name, _, attr = self.value.partition(":")
        obj: object = importlib.import_module(module_name.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


@dataclass
class Distribution:
    """An installed distribution found on ``sys.path``; metadata is read on first use."""

    path: str
    _headers: dict[str, list[str]] | None = field(default=None, repr=False)

    def _read_headers(self) -> dict[str, list[str]]:
        if self._headers is None:
            headers: dict[str, list[str]] = {}
            for filename in ("METADATA", "PKG-INFO"):
                file = os.path.join(self.path, filename)
                if os.path.isfile(file):
                    with open(file, encoding="utf-8", errors="replace") as handle:
                        for line in handle:
                            if not line.strip():
                                break  # the body (long description) starts after the first blank line
                            key, sep, value = line.partition(":")
                            if sep and not line[0].isspace():
                                headers.setdefault(key.strip(), []).append(value.strip())
                    break
            self._headers = headers
        return self._headers

    @property
    def name(self) -> str:
        """The project name as its metadata spells it."""
        return self._read_headers().get("Name", [""])[0]

    @property
    def version(self) -> str:
        """The installed version."""
        return self._read_headers().get("Version", [""])[0]

    @property
    def requires(self) -> list[str]:
        """``Requires-Dist`` lines (PEP 508 strings, markers included)."""
        return list(self._read_headers().get("Requires-Dist", []))

    def entry_points(self, group: str) -> list[EntryPoint]:
        """Entry points of ``group`` declared by this distribution."""
        file = os.path.join(self.path, "entry_points.txt")
        if not os.path.isfile(file):
            return []
        found: list[EntryPoint] = []
        current = None
        with open(file, encoding="utf-8") as handle:
            for raw in handle:
                line = raw.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("[") and line.endswith("]"):
                    current = line[1:-1].strip()
                    continue
                if current == group and "=" in line:
                    name, _, value = line.partition("=")
                    found.append(EntryPoint(name.strip(), value.strip(), group, self))
        return found


_cache: dict[str, Distribution] | None = None


def distributions() -> dict[str, Distribution]:
    """Installed distributions by canonical name; the first one on ``sys.path`` wins."""
    global _cache
    if _cache is None:
        found: dict[str, Distribution] = {}
        for entry in sys.path:
            folder = entry or "."
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for item in names:
                if not item.endswith((".dist-info", ".egg-info")):
                    continue
                path = os.path.join(folder, item)
                if not os.path.isdir(path):
                    continue
                stem = item.rsplit(".", 1)[0]
                key = canonical_name(stem.split("-")[0])
                if key not in found:
                    found[key] = Distribution(path)
        _cache = found
    return _cache


def find(name: str) -> Distribution | None:
    """The installed distribution called ``name`` (any spelling), or ``None``."""
    return distributions().get(canonical_name(name))


def version(name: str) -> str | None:
    """The installed version of ``name``, or ``None`` when it is not installed."""
    dist = find(name)
    return None if dist is None else dist.version


def entry_points(group: str) -> list[EntryPoint]:
    """All entry points of ``group`` across installed distributions."""
    return [ep for dist in distributions().values() for ep in dist.entry_points(group)]


def _clear_cache() -> None:
    """Forget what was found (after installing or removing a package in this process)."""
    global _cache
    _cache = None


_OPERATORS = (">=", "<=", "==", "!=", "~=", ">", "<")


def _release(version: str) -> tuple[int, ...] | None:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``; ``None`` for anything beyond plain release numbers."""
    parts = version.split("+", 1)[0].split(".")
    if not all(p.isdigit() for p in parts):
        return None
    release = [int(p) for p in parts]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return tuple(release)


def split_requirement(requirement: str) -> tuple[str, str, str] | None:
    """``"torch>=2.1,<3"`` -> ``("torch", ">=2.1,<3", "")``; ``None`` when extras or markers need packaging."""
    text = requirement.strip()
    if ";" in text or "[" in text or "@" in text:
        return None
    end = 0
    while end < len(text) and (text[end].isalnum() or text[end] in "-_."):
        end += 1
    return text[:end], text[end:].strip().strip("()").replace(" ", ""), ""


def satisfies(installed: str, specifier: str) -> bool | None:
    """Judge plain release versions against a specifier set without importing packaging.

    Returns ``None`` when a version or clause needs full PEP 440 handling (pre-releases, wildcards):
    the caller then asks ``packaging``. Importing packaging costs tens of milliseconds, which
    ``phalanx strategies`` cannot afford for the common ``"torch>=2.1"`` case.
    """
    have = _release(installed)
    if have is None:
        return None
    for clause in filter(None, specifier.split(",")):
        op = next((o for o in _OPERATORS if clause.startswith(o)), None)
        if op is None or clause.endswith("*"):
            return None
        want = _release(clause[len(op) :])
        if want is None:
            return None
        if op == "~=":  # compatible release: >= the version, same release up to its last component
            written = [int(p) for p in clause[len(op) :].split(".")]
            prefix = tuple(written[:-1])
            padded = have + (0,) * max(0, len(prefix) - len(have))
            ok = have >= want and padded[: len(prefix)] == prefix
        else:
            ok = {">=": have >= want, "<=": have <= want, "==": have == want, "!=": have != want, ">": have > want, "<": have < want}[op]
        if not ok:
            return False
    return True
