"""Installed-distribution facts through ``importlib.metadata``, plus a fast path for plain specifiers.

Discovery and listing need three facts: the entry points of one group, installed versions, and
``Requires-Dist`` lines. ``importlib.metadata`` answers all three with the import system's own
first-on-path-wins rule, so this module only adds a per-process cache of versions (listing asks
for the same few names many times) and imports ``importlib.metadata`` on first use, so that
``import phalanx`` does not pay for it.

Judging a requirement is packaging's job, but importing ``packaging.requirements`` costs about as
much as the whole listing (benchmarks/bench_cli.py). Plugins' requirements are almost always
plain (``"deepspeed>=0.14"``), so :func:`satisfies` judges plain release versions against plain
clauses itself and answers ``None`` for anything else, which callers hand to packaging;
core/tests/test_metadata.py checks that the two agree.
"""

from __future__ import annotations

import functools
import re

TYPE_CHECKING = False  # typing's own flag, without importing typing (mypy reads this name as True)

if TYPE_CHECKING:
    from importlib.metadata import Distribution, EntryPoint

__all__ = [
    "canonical_name",
    "clear_cache",
    "distribution_of",
    "entry_points",
    "satisfies",
    "split_requirement",
    "unmet",
    "version",
]


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: lower case, runs of ``-_.`` become one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def version(name: str) -> str | None:
    """The installed version of distribution ``name`` (any spelling), or ``None`` when absent."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def entry_points(group: str) -> list[EntryPoint]:
    """Entry points of ``group``, one per distribution name (the first on ``sys.path`` wins)."""
    import importlib.metadata

    return list(importlib.metadata.entry_points(group=group))


def distribution_of(entry_point: EntryPoint) -> Distribution | None:
    """The distribution that declares ``entry_point`` (``None`` for a hand-made entry point)."""
    return entry_point.dist


def clear_cache() -> None:
    """Forget cached versions and path listings (after installing or removing in this process)."""
    import importlib

    version.cache_clear()
    importlib.invalidate_caches()  # also drops importlib.metadata's cached folder listings


_OPERATORS = (">=", "<=", "==", "!=", "~=", ">", "<")


def _release(text: str) -> tuple[int, ...] | None:
    """``"2.13.0+cpu"`` -> ``(2, 13)``; ``None`` for anything beyond plain release numbers."""
    parts = text.split("+", 1)[0].split(".")
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
    """Judge a plain release version against plain clauses without importing packaging.

    Returns ``None`` when the version or a clause needs full PEP 440 handling (pre-releases,
    wildcards, local labels in the clause): the caller then asks ``packaging``.
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


def unmet(requirement: str) -> tuple[str, str | None] | None:
    """Check one PEP 508 requirement against what is installed, without importing it.

    Returns ``None`` when it is met (or its marker excludes this environment), else the
    distribution name and its installed version (``None``: not installed). Plain requirements are
    judged by :func:`satisfies`; extras, markers, pre-releases and wildcards by packaging.
    """
    simple = split_requirement(requirement)
    if simple is not None:
        name, specifier, _ = simple
        installed = version(name)
        if installed is None:
            return name, None
        verdict = satisfies(installed, specifier)
        if verdict is not None:
            return None if verdict else (name, installed)
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return None
    installed = version(req.name)
    if installed is None:
        return req.name, None
    if req.specifier and not req.specifier.contains(installed, prereleases=True):
        return req.name, installed
    return None
