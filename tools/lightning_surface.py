"""Lightning's public API beside phalanx's: what a Lightning script may use that phalanx lacks.

The rename rule (DESIGN.md §3) promises that a Lightning 2.x script runs on phalanx after
``lightning.pytorch`` -> ``phalanx``, ``LightningModule`` -> ``Module`` and
``LightningDataModule`` -> ``DataModule``. This tool measures how much of the surface that
promise covers today, group by group:

* ``Trainer.__init__`` arguments (``inspect.signature``),
* public ``Trainer`` members (``dir``, no leading underscore),
* public ``Module`` members (``LightningModule`` vs ``phalanx.Module``, both less ``torch.nn.Module``'s own),
* public ``DataModule`` members,
* the names exported by the packages a script imports from (``lightning.pytorch``,
  ``.callbacks``, ``.loggers``, ``.strategies``, ``.utilities``) that phalanx's namesakes lack.

Run it where both Lightning and phalanx import (the ``lightning`` nox session runs it)::

    python tools/lightning_surface.py          # a table, then the missing names per group
    python tools/lightning_surface.py --json   # the same as one JSON object

It only reports: the exit status is 0 whatever is missing, 2 when Lightning or phalanx does not
import. Names phalanx has that Lightning lacks are counted (``extra``), not listed; names phalanx
resolves from a plugin package that is not installed are counted apart (``plugin``), not as missing.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

#: (group, Lightning module, phalanx module) whose exported names are compared.
PACKAGES = (
    ("package lightning.pytorch", "lightning.pytorch", "phalanx"),
    ("package .callbacks", "lightning.pytorch.callbacks", "phalanx.callbacks"),
    ("package .loggers", "lightning.pytorch.loggers", "phalanx.loggers"),
    ("package .strategies", "lightning.pytorch.strategies", "phalanx.strategies"),
    ("package .utilities", "lightning.pytorch.utilities", "phalanx.utilities"),
)

#: Lightning's names the rename rule maps onto phalanx's.
RENAMED = {"LightningModule": "Module", "LightningDataModule": "DataModule"}


@dataclass
class Group:
    """One compared group: how many names each side has, and which of Lightning's phalanx lacks."""

    name: str
    lightning: int
    phalanx: int
    common: int
    extra: int
    missing: list[str] = field(default_factory=list)
    #: Names phalanx knows but cannot provide here: their plugin package is not installed.
    needs_plugin: list[str] = field(default_factory=list)
    note: str = ""


def _public(names: Any) -> set[str]:
    return {name for name in names if not name.startswith("_")}


def _compare(
    name: str, theirs: set[str], ours: set[str] | None, note: str = "", needs_plugin: set[str] | None = None
) -> Group:
    ours = ours if ours is not None else set()
    needs_plugin = needs_plugin or set()
    return Group(
        name=name,
        lightning=len(theirs),
        phalanx=len(ours),
        common=len(theirs & ours),
        extra=len(ours - theirs),
        missing=sorted(theirs - ours - needs_plugin),
        needs_plugin=sorted(theirs & needs_plugin),
        note=note,
    )


def _init_arguments(cls: type) -> set[str]:
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _exported(module_name: str) -> set[str]:
    """What ``from module import *`` and attribute access offer: ``__all__``, else the public names."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    return _public(names if names is not None else dir(module))


def _phalanx_has(module_name: str, names: set[str]) -> tuple[set[str] | None, set[str], str]:
    """Which of ``names`` resolve on the phalanx module (lazy attributes included), which need a
    plugin that is not installed, and a note when the module itself does not import."""
    from phalanx.errors import PluginUnavailableError

    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        return None, set(), f"{module_name} does not import: {error}"
    found, needs_plugin = set(), set()
    for name in names:
        try:
            getattr(module, name)
        except PluginUnavailableError:
            needs_plugin.add(name)
        except (AttributeError, ImportError):
            continue
        else:
            found.add(name)
    return found | _exported(module_name), needs_plugin, ""


def compare() -> list[Group]:
    """Every group, Lightning first; both libraries must import."""
    import lightning.pytorch as lp
    import torch

    import phalanx

    nn_members = _public(dir(torch.nn.Module))
    groups = [
        _compare("Trainer.__init__ arguments", _init_arguments(lp.Trainer), _init_arguments(phalanx.Trainer)),
        _compare("Trainer public members", _public(dir(lp.Trainer)), _public(dir(phalanx.Trainer))),
        _compare(
            "Module public members",
            _public(dir(lp.LightningModule)) - nn_members,
            _public(dir(phalanx.Module)) - nn_members,
            note="torch.nn.Module's own members excluded from both",
        ),
    ]
    try:
        data_module = phalanx.DataModule
    except AttributeError:
        groups.append(
            _compare("DataModule public members", _public(dir(lp.LightningDataModule)), None, "no phalanx.DataModule")
        )
    else:
        groups.append(
            _compare("DataModule public members", _public(dir(lp.LightningDataModule)), _public(dir(data_module)))
        )
    for name, theirs_module, ours_module in PACKAGES:
        theirs = _exported(theirs_module)
        ours, needs_plugin, note = _phalanx_has(ours_module, theirs | set(RENAMED.values()))
        if ours is not None:
            ours |= {theirs_name for theirs_name, ours_name in RENAMED.items() if ours_name in ours}
        if needs_plugin:
            note = "some names need a plugin package that is not installed here"
        groups.append(_compare(name, theirs, ours, note, needs_plugin))
    return groups


def _versions() -> dict[str, str]:
    import lightning
    import torch

    import phalanx

    return {"lightning": lightning.__version__, "phalanx": phalanx.__version__, "torch": torch.__version__}


def _table(groups: list[Group], versions: dict[str, str]) -> str:
    header = (
        "group",
        f"lightning {versions['lightning']}",
        f"phalanx {versions['phalanx']}",
        "common",
        "missing",
        "extra",
        "plugin",
    )
    rows = [header] + [
        (
            g.name,
            str(g.lightning),
            str(g.phalanx),
            str(g.common),
            str(len(g.missing)),
            str(g.extra),
            str(len(g.needs_plugin)),
        )
        for g in groups
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for group in groups:
        if group.missing or group.note:
            lines.append("")
            lines.append(f"{group.name}: {len(group.missing)} missing" + (f" ({group.note})" if group.note else ""))
            lines.extend(f"  {name}" for name in group.missing)
        if group.needs_plugin:
            lines.append(f"  needing a plugin not installed here: {', '.join(group.needs_plugin)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    try:
        versions = _versions()
        groups = compare()
    except ImportError as error:
        print(f"lightning_surface: {error}. Run it where both import, e.g. `nox -s lightning`.", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"versions": versions, "groups": [asdict(g) for g in groups]}, indent=2))
    else:
        print(_table(groups, versions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
