"""The verified report: what a conformance kit ran against which plugin, and how it ended.

``pytest --phalanx-report=report.json`` feeds a :class:`ReportBuilder` every test of a kit class
(the ``phalanx_conformance`` marker) with its outcome or that it was deselected, and at the end
writes one JSON file: the versions it ran under (phalanx-core, torch, Python) and, per plugin
under test, its kind, registered name, entry point, distribution and version with the checks
passed / failed / skipped / deselected. A package ships the file as
``<top-level package>/phalanx-report.json``; ``phalanx plugins --verified`` reads it from there
without importing torch or pytest (:func:`find_report`, :func:`verdict`).
"""

from __future__ import annotations

import json
import platform
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from phalanx.version import __version__

__all__ = [
    "REPORT_FILE",
    "REPORT_FORMAT",
    "ReportBuilder",
    "find_report",
    "minor",
    "read_report",
    "torch_version",
    "validate_report",
    "verdict",
]

#: The file name a package ships its report under, inside its top-level import package.
REPORT_FILE = "phalanx-report.json"
REPORT_FORMAT = 1
#: Kit class name -> (kind as `phalanx new` spells it, registry in phalanx.registry, class attributes naming the plugin).
_KITS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "StrategyConformance": ("strategy", "StrategyRegistry", ("strategy",)),
    "AcceleratorConformance": ("accelerator", "AcceleratorRegistry", ("accelerator", "name")),
    "PrecisionConformance": ("precision", "PrecisionRegistry", ("precision", "name")),
    "CheckpointIOConformance": ("checkpoint-io", "CheckpointIORegistry", ("checkpoint_io", "name")),
    "ClusterEnvironmentConformance": (
        "environment",
        "ClusterEnvironmentRegistry",
        ("environment", "cluster_environment", "name"),
    ),
    "CallbackConformance": ("callback", "CallbackRegistry", ("callback", "name")),
    "LoggerConformance": ("logger", "LoggerRegistry", ("logger", "name")),
}
_OUTCOMES = ("passed", "failed", "skipped", "deselected")


def torch_version() -> str | None:
    """The installed torch's version from its metadata (no import), local part (``+cpu``) dropped."""
    try:
        return version("torch").split("+")[0]
    except PackageNotFoundError:
        return None


def minor(text: str | None) -> str | None:
    """``"2.13.0"`` -> ``"2.13"``: reports are judged per minor release of torch and the core."""
    found = re.match(r"(\d+)\.(\d+)", text or "")
    return f"{found.group(1)}.{found.group(2)}" if found else None


@dataclass
class _Suite:
    """One kit class in the run: the plugin it checks and its checks' outcomes."""

    kit: str
    kind: str
    name: str
    suite: str
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)


def _kit_of(cls: type) -> str | None:
    for base in cls.__mro__:
        if base.__name__ in _KITS and base.__module__.startswith("phalanx.testing"):
            return base.__name__
    return None


def _plugin_name(cls: type, attributes: tuple[str, ...]) -> str:
    for attribute in attributes:
        value = getattr(cls, attribute, None)
        if isinstance(value, str) and value:
            return value
    return ""


def _source(registry_name: str, name: str) -> dict[str, Any]:
    """Entry point, distribution and version of the plugin that registered ``name``."""
    from phalanx import registry

    try:
        entry = getattr(registry, registry_name).entry(name)
    except Exception as err:
        return {"plugin": None, "distribution": None, "version": None, "error": str(err).splitlines()[0]}
    return {"plugin": entry.source.plugin, "distribution": entry.source.distribution, "version": entry.source.version}


class ReportBuilder:
    """Collects the kits' outcomes of one pytest run (the pytest plugin feeds it) and writes the report."""

    def __init__(self) -> None:
        self._suites: dict[str, _Suite] = {}
        self._items: dict[str, tuple[str, str]] = {}  # nodeid -> (suite key, check name)

    def note(self, nodeid: str, cls: type | None, check: str) -> bool:
        """Remember a test of a kit class; False when ``cls`` is not one (the test is not reported)."""
        kit = _kit_of(cls) if cls is not None else None
        if cls is None or kit is None:
            return False
        kind, _, attributes = _KITS[kit]
        key = f"{cls.__module__}.{cls.__qualname__}"
        if key not in self._suites:
            self._suites[key] = _Suite(kit, kind, _plugin_name(cls, attributes), cls.__qualname__)
        self._items[nodeid] = (key, check)
        return True

    def set(self, nodeid: str, outcome: str, seconds: float = 0.0) -> None:
        """Record a noted test's outcome; a failure (in setup, call or teardown) is never overwritten."""
        found = self._items.get(nodeid)
        if found is None:
            return
        key, check = found
        if self._suites[key].checks.get(check, {}).get("outcome") == "failed":
            return
        self._suites[key].checks[check] = {"outcome": outcome, "seconds": round(seconds, 2)}

    def write(self, path: Path) -> None:
        """Write :meth:`report` as JSON to ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.report(), indent=2) + "\n", encoding="utf-8")

    def report(self) -> dict[str, Any]:
        """The report as written: versions, then one entry per kit class with its checks."""
        plugins = []
        for suite in self._suites.values():
            counts = {o: sum(c["outcome"] == o for c in suite.checks.values()) for o in _OUTCOMES}
            ran = counts["passed"] + counts["failed"]
            _, registry_name, _ = _KITS[suite.kit]
            plugins.append(
                {
                    "kind": suite.kind,
                    "name": suite.name,
                    **_source(registry_name, suite.name),
                    "kit": suite.kit,
                    "suite": suite.suite,
                    **counts,
                    "outcome": "passed" if ran and not counts["failed"] else "failed",
                    "checks": [{"check": check, **result} for check, result in sorted(suite.checks.items())],
                }
            )
        return {
            "format": REPORT_FORMAT,
            "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "core_version": __version__,
            "torch_version": torch_version(),
            "python_version": platform.python_version(),
            "platform": platform.system().lower(),
            "plugins": plugins,
        }


def validate_report(data: Any) -> list[str]:
    """What is wrong with a report's shape (empty when well-formed)."""
    problems = []
    if not isinstance(data, dict):
        return [f"a report is a JSON object, got {type(data).__name__}"]
    if data.get("format") != REPORT_FORMAT:
        problems.append(f"format is {data.get('format')!r}, expected {REPORT_FORMAT}")
    for key in ("core_version", "torch_version", "created"):
        if not isinstance(data.get(key), str):
            problems.append(f"{key} is {data.get(key)!r}, expected a string")
    plugins = data.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        return [*problems, "plugins is empty: the run collected no conformance kit class"]
    for entry in plugins:
        for key in ("kind", "name", "plugin", "distribution", "kit", "outcome"):
            if not isinstance(entry.get(key), str) or not entry.get(key):
                problems.append(f"plugin entry {entry.get('name')!r}: {key} is {entry.get(key)!r}")
        checks = entry.get("checks") or []
        if not checks or any(c.get("outcome") not in _OUTCOMES for c in checks):
            problems.append(f"plugin entry {entry.get('name')!r}: checks missing or with an unknown outcome")
        for outcome in _OUTCOMES:
            if entry.get(outcome) != sum(c.get("outcome") == outcome for c in checks):
                problems.append(f"plugin entry {entry.get('name')!r}: {outcome} count does not match its checks")
    return problems


def find_report(entry_point_value: str) -> Path | None:
    """The report shipped beside a plugin: ``<top package of the entry point>/phalanx-report.json``.

    ``find_spec`` on a top-level name locates the package without running it, so this stays as
    cheap as listing.
    """
    top = entry_point_value.split(":")[0].split(".")[0]
    try:
        spec = find_spec(top)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / REPORT_FILE
        if path.is_file():
            return path
    return None


def read_report(path: Path) -> dict[str, Any] | None:
    """The parsed report, or None when it is not valid JSON."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _counts(suite: dict[str, Any]) -> str:
    """``"ddp_fork: 10 passed, 1 deselected"``: the non-zero counts of one kit class."""
    counts = [f"{suite[o]} {o}" for o in _OUTCOMES if suite[o] or o == "passed"]
    return f"{suite['name']}: {', '.join(counts)}"


def verdict(entry_point: str, distribution: str | None, report: dict[str, Any] | None) -> dict[str, Any]:
    """Whether ``report`` verifies the plugin for the running core and torch minors, and why.

    Status ``verified`` (its kit passed for this core and torch minor), ``failed`` (it ran here and
    failed), ``stale`` (the report is for another core or torch minor) or ``unverified`` (no report,
    or none of its entries is this plugin's).
    """
    here = {"core": minor(__version__), "torch": minor(torch_version())}
    if report is None:
        return {"status": "unverified", "detail": "no report shipped", "suites": []}
    if validate_report(report):
        return {"status": "unverified", "detail": "report is malformed", "suites": []}
    suites = [
        p for p in report["plugins"] if p.get("plugin") == entry_point and p.get("distribution") in (None, distribution)
    ]
    if not suites:
        return {"status": "unverified", "detail": "the report has no entry for this plugin", "suites": []}
    ran = {"core": minor(report["core_version"]), "torch": minor(report["torch_version"])}
    summary = [
        {"name": s["name"], "kind": s["kind"], "outcome": s["outcome"], **{o: s[o] for o in _OUTCOMES}} for s in suites
    ]
    names = "; ".join(_counts(s) for s in suites)
    where = f"core {report['core_version']}, torch {report['torch_version']}"
    if ran != here:
        detail = f"{names} under {where}; this is core {__version__}, torch {torch_version()}"
        return {"status": "stale", "detail": detail, "suites": summary, **ran}
    status = "verified" if all(s["outcome"] == "passed" for s in suites) else "failed"
    return {"status": status, "detail": names, "suites": summary, **ran}
