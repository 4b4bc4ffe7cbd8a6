"""``phalanx strategies`` and ``phalanx plugins [--verified]``: tables that fit a terminal.

Reads entry points and distribution metadata only (never torch), so both answer instantly. A
strategy *variant* (``ddp_find_unused_parameters_true``) is folded under its base name (``ddp``):
it has the base's name as a prefix, the same target class from the same plugin, and the base's
init parameters plus more. ``--all`` lists every name; ``--json`` is unchanged and complete.
``plugins --verified`` reads the conformance report each plugin ships (no torch import either).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from phalanx.registry import RegistryEntry

__all__ = [
    "MAX_WIDTH",
    "StrategyGroup",
    "fold_variants",
    "print_plugins",
    "print_strategies",
    "print_verified",
    "strategy_rows",
    "verified_rows",
]

#: Widest table printed, whatever the terminal says (long lines wrap into noise in a narrow one).
MAX_WIDTH = 100


@dataclass
class StrategyGroup:
    """A base strategy name and the variants folded under it."""

    base: RegistryEntry
    variants: list[RegistryEntry] = field(default_factory=list)


def _is_variant(entry: RegistryEntry, base: RegistryEntry) -> bool:
    if entry is base or not entry.name.startswith(base.name + "_"):
        return False
    if entry.target_path != base.target_path or entry.source.plugin != base.source.plugin:
        return False
    return all(key in entry.init_params and entry.init_params[key] == value for key, value in base.init_params.items())


def fold_variants(entries: Sequence[RegistryEntry]) -> list[StrategyGroup]:
    """Group ``entries`` under their base names, in registration order of the bases."""
    parent: dict[str, RegistryEntry] = {}
    for entry in entries:
        candidates = [base for base in entries if _is_variant(entry, base)]
        if candidates:
            parent[entry.name] = max(candidates, key=lambda base: len(base.name))

    def root(entry: RegistryEntry) -> RegistryEntry:
        while entry.name in parent:
            entry = parent[entry.name]
        return entry

    groups: dict[str, StrategyGroup] = {}
    for entry in entries:
        base = root(entry)
        group = groups.setdefault(base.name, StrategyGroup(base))
        if entry is not base:
            group.variants.append(entry)
    return list(groups.values())


def strategy_rows() -> list[dict[str, Any]]:
    """Every registered strategy as the JSON objects of ``phalanx strategies --json``."""
    from phalanx.registry import StrategyRegistry

    rows = []
    for entry in StrategyRegistry.entries():
        reason = entry.unavailable_reason()
        rows.append(
            {
                "name": entry.name,
                "description": entry.description,
                "plugin": entry.source.plugin,
                "distribution": entry.source.distribution,
                "version": entry.source.version,
                "target": entry.target_path,
                "available": reason is None,
                "reason": reason,
            }
        )
    return rows


def terminal_width() -> int:
    """The terminal's width capped at :data:`MAX_WIDTH` (100 when output is not a terminal)."""
    return max(60, min(shutil.get_terminal_size((MAX_WIDTH, 24)).columns, MAX_WIDTH))


def _cut(text: str, width: int) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: max(0, width - 3)].rstrip() + "..."


def _table(rows: list[list[str]], header: list[str], width: int) -> list[str]:
    """Left-aligned columns; the last column is cut so every line fits in ``width``."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    room = max(10, width - sum(widths) - 2 * len(widths))
    lines = []
    for row in [header, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(row, widths)] + [_cut(row[-1], room)]
        lines.append("  ".join(cells).rstrip())
    return lines


def _wrapped(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, subsequent_indent="    ", break_on_hyphens=False) or [""]


def print_strategies(*, show_all: bool, as_json: bool) -> int:
    """Print the strategy table (folded unless ``show_all``), unavailable reasons and plugin problems."""
    from phalanx.registry import StrategyRegistry

    if as_json:
        print(json.dumps(strategy_rows(), indent=2))
        return 0
    width = terminal_width()
    entries = StrategyRegistry.entries()
    groups = fold_variants(entries)
    table = []
    for group in groups:
        shown = [group.base, *group.variants] if show_all else [group.base]
        for entry in shown:
            name = entry.name if show_all or not group.variants else f"{entry.name} (+{len(group.variants)})"
            table.append([name, "yes" if entry.available else "no", entry.source.plugin, entry.description])
    lines = _table(table, ["NAME", "OK", "PLUGIN", "DESCRIPTION"], width)
    folded = sum(len(g.variants) for g in groups)
    if folded and not show_all:
        lines.append("")
        lines += _wrapped(
            f"(+N): N variants of that name folded ({len(entries)} names in all); `phalanx strategies --all` "
            "lists every name, `phalanx plugins` shows each plugin's distribution and version.",
            width,
        )
    reasons: dict[str, list[str]] = {}
    for entry in entries:
        reason = entry.unavailable_reason()
        if reason is not None:
            reasons.setdefault(reason, []).append(entry.name)
    for reason, names in reasons.items():
        lines.append("")
        lines += _wrapped(f"{', '.join(names)}: {reason}", width)
    for problem in plugin_problems():
        lines.append("")
        lines += _wrapped(problem, width)
    print("\n".join(lines))
    return 0


def plugin_problems() -> list[str]:
    """One sentence per plugin that did not load: name, distribution, status and reason."""
    from phalanx.discovery import plugin_records

    return [
        f"plugin {r.name!r} ({r.distribution or 'unknown distribution'}) {r.status}: {r.reason}"
        for r in plugin_records()
        if r.status != "loaded"
    ]


def verified_rows() -> list[dict[str, Any]]:
    """Per entry point: the record of ``phalanx plugins --json`` plus ``verified`` (see :func:`verdict`)."""
    from phalanx.discovery import plugin_records
    from phalanx.testing._report import find_report, read_report, verdict

    rows = []
    for record in plugin_records():
        path = find_report(record.value)
        judged = verdict(record.name, record.distribution, read_report(path) if path else None)
        if record.status != "loaded":  # an incompatible or broken plugin is not usable, whatever its report says
            judged = {**judged, "status": record.status, "detail": record.reason or record.status}
        rows.append({**record.as_dict(), "verified": {**judged, "report": str(path) if path else None}})
    return rows


def print_verified(*, as_json: bool) -> int:
    """Print, per plugin, whether a shipped report verifies it for this core and torch minor."""
    from phalanx.testing._report import minor, torch_version
    from phalanx.version import __version__

    rows = verified_rows()
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    width = terminal_width()
    table = [
        [
            row["entry_point"],
            f"{row['distribution'] or '?'} {row['version'] or ''}".strip(),
            row["verified"]["status"],
            row["verified"]["detail"],
        ]
        for row in rows
    ]
    lines = _table(table, ["ENTRY POINT", "DISTRIBUTION", "VERIFIED", "KIT RESULT"], width)
    lines.append("")
    lines += _wrapped(
        f"verified: the plugin ships phalanx-report.json and its conformance kit passed under this core "
        f"({minor(__version__)}) and torch ({minor(torch_version()) or 'not installed'}) minor; stale: the report is "
        "for another minor; `phalanx plugins --verified --json` gives every check's counts.",
        width,
    )
    print("\n".join(lines))
    return 0


def print_plugins(*, as_json: bool, verbose: bool = False) -> int:
    """Print every entry point of the ``phalanx`` group with its status and what it provides; with
    ``verbose``, each registered strategy's declared capabilities too."""
    from phalanx.discovery import plugin_records

    records = plugin_records()
    if as_json:
        print(json.dumps([r.as_dict() for r in records], indent=2))
        return 0
    width = terminal_width()
    table = []
    for record in records:
        provides = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in record.provides.items())
        version = f"{record.distribution or '?'} {record.version or ''}".strip()
        table.append([record.name, version, record.status, provides or "-"])
    lines = _table(table, ["ENTRY POINT", "DISTRIBUTION", "STATUS", "PROVIDES"], width)
    for record in records:
        if record.reason:
            lines.append("")
            lines += _wrapped(f"{record.name}: {record.reason}", width)
    lines.append("")
    lines += _wrapped("Long lines are cut; `phalanx plugins --json` lists every provided name in full.", width)
    if verbose:
        lines += ["", "CAPABILITIES (what each strategy declares beyond its base class's defaults; docs/plugins.md)"]
        lines += _capability_lines(width)
    print("\n".join(lines))
    return 0


def _capability_lines(width: int) -> list[str]:
    """One line per registered strategy: the capabilities it declares (phalanx.strategies.capabilities)."""
    from phalanx.registry import StrategyRegistry
    from phalanx.strategies.capabilities import declared_differences

    lines = []
    for name in StrategyRegistry.available_strategies():
        try:
            declared = declared_differences(StrategyRegistry.get(name))
        except Exception as error:  # a strategy that cannot be built here (its library is missing)
            lines += _wrapped(f"  {name}: not built here ({type(error).__name__}: {error})", width)
            continue
        text = ", ".join(f"{key}={value!r}" for key, value in declared.items()) or "the defaults"
        lines += _wrapped(f"  {name}: {text}", width)
    return lines
