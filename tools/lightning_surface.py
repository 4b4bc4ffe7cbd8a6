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
  ``.callbacks``, ``.loggers``, ``.strategies``, ``.utilities``) that phalanx's namesakes lack,
* **every public module path** of ``lightning.pytorch``: whether ``phalanx.<path>`` imports and
  which of the module's public names it lacks, with a total of names and modules present.

A module path is public when no dotted segment starts with ``_`` (found with ``pkgutil``). A
module's public names are its ``__all__`` when it has one; otherwise the non-underscore names its
own source binds at module level (classes, functions and constants; loggers, type variables and
``TYPE_CHECKING`` are not names a script imports) plus the names it imports on a line marked
``# noqa: F401`` (the linter's mark for an import kept on purpose: a re-export). Names it merely
imports for its own use (``Optional``, ``MisconfigurationException`` in every module) do not
count. A name is present when ``getattr(phalanx.<path>, renamed)`` works. Deliberate differences,
each with its reason, are listed once in :data:`DIFFERENCES` and reported apart from "missing".

Run it where both Lightning and phalanx import (the ``lightning`` nox session runs it)::

    python tools/lightning_surface.py          # a table, then the missing names per group
    python tools/lightning_surface.py --json   # the same as one JSON object

It only reports: the exit status is 0 whatever is missing, 2 when Lightning or phalanx does not
import. Names phalanx has that Lightning lacks are counted (``extra``), not listed; names phalanx
resolves from a plugin package that is not installed are counted apart (``plugin``), not as missing.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import logging
import pkgutil
import sys
import typing
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
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

_RICH_COLUMNS = (
    "a rich column/task class Lightning's RichProgressBar is assembled from (defined only when rich is installed); "
    "phalanx's RichProgressBar draws with rich's own columns, styled by RichProgressBarTheme"
)

_LOOP_OBJECTS = (
    "Lightning's loop objects (fit/epoch/evaluation loops, their restart stages, progress trackers, data fetchers, "
    "closure result records) are its internal machinery; phalanx's step pipeline is phalanx.trainer.fit_loop and "
    "phalanx.trainer.step, with no loop objects to replace or restart"
)

#: Lightning's public module paths or names that phalanx does not provide on purpose, with why.
#: A key is a module path (the module and everything below it) or ``"module:Name"``; the same text
#: is the table at the end of docs/migrating-from-lightning.md.
DIFFERENCES: dict[str, str] = {
    # Lightning's internals: modules whose public names are its loop and connector machinery.
    # phalanx.loops offers optimization.automatic.Closure and utilities.check_finite_loss; the rest is
    # Lightning's loop objects.
    **{
        f"lightning.pytorch.loops.{path}": _LOOP_OBJECTS
        for path in (
            "loop",
            "fit_loop",
            "training_epoch_loop",
            "evaluation_loop",
            "prediction_loop",
            "fetchers",
            "progress",
            "optimization.closure",
            "optimization.manual",
        )
    },
    "lightning.pytorch.loops.optimization.automatic:ClosureResult": "the record Lightning's closure returns "
    "internally; phalanx's Closure returns the loss, as optimizer.step(closure) expects",
    "lightning.pytorch.trainer.connectors": "the Trainer's private helpers (no public names); phalanx's are "
    "phalanx.trainer.strategy_resolution, .data, .checkpointing, .metrics",
    "lightning.pytorch.trainer.call": "private Trainer helpers (no public names)",
    "lightning.pytorch.trainer.setup": "private Trainer helpers (no public names)",
    "lightning.pytorch.trainer.configuration_validator": "private Trainer helpers (no public names); phalanx "
    "validates in phalanx.trainer.arguments",
    "lightning.pytorch.strategies.launchers": "Lightning's launchers are private (_SubprocessScriptLauncher, ...); "
    "phalanx's are public at phalanx.launchers (SubprocessScriptLauncher, MultiProcessingLauncher)",
    "lightning.pytorch.strategies.deepspeed:remove_module_hooks": "a DeepSpeed-engine internal of Lightning's "
    "strategy; phalanx's DeepSpeedStrategy (phalanx-strategy-deepspeed) does not need it",
    "lightning.pytorch.overrides": "Lightning's DDP internals: prepare_for_backward reaches into DDP's reducer "
    "(phalanx's DDP never needs it) and the unpadded prediction sampler is "
    "phalanx.trainer.predict_loop.UnrepeatedDistributedSampler (keyword-only num_replicas/rank)",
    "lightning.pytorch.tuner.batch_size_scaling": "private functions (no public names); phalanx's search is "
    "phalanx.callbacks.BatchSizeFinder",
    "lightning.pytorch.plugins.io.wrapper": "a private base class (no public names)",
    "lightning.pytorch.utilities.imports": "availability flags are private (no public names)",
    "lightning.pytorch.utilities.testing": "Lightning's own test-suite helper (private _runif_reasons); phalanx's "
    "testing kit is phalanx.testing",
    "lightning.pytorch.utilities.argparse": "private helpers (no public names); the Trainer's PL_TRAINER_* "
    "environment defaults are phalanx.trainer.arguments.env_defaults",
    "lightning.pytorch.loggers.utilities": "private helpers (no public names)",
    # Hosted services and sunset integrations.
    "lightning.pytorch.loggers.comet": "CometLogger logs to a hosted service; not implemented",
    "lightning.pytorch.loggers.litlogger": "LitLogger logs to Lightning's hosted platform",
    "lightning.pytorch.loggers.neptune": "Lightning's NeptuneLogger only raises (Neptune was sunset)",
    "lightning.pytorch.loggers:CometLogger": "logs to a hosted service; not implemented",
    "lightning.pytorch.loggers:LitLogger": "logs to Lightning's hosted platform",
    "lightning.pytorch.utilities.model_registry": "downloads from Lightning's hosted model registry",
    "lightning.pytorch.serve": "Lightning's serving check starts a FastAPI server against its ServableModule "
    "API; phalanx has no serving integration",
    # Checkpoints of older Lightning versions.
    "lightning.pytorch.utilities.migration": "upgrades checkpoints written by older Lightning versions; run "
    "Lightning's own upgrade_checkpoint on them",
    "lightning.pytorch.utilities.upgrade_checkpoint": "upgrades checkpoints written by older Lightning versions; "
    "run it with Lightning installed",
    "lightning.pytorch.utilities.consolidate_checkpoint": "a command-line script; `phalanx checkpoint convert SRC "
    "DST` consolidates any strategy's checkpoint",
    # Hardware and libraries phalanx does not ship a core class for.
    "lightning.pytorch.plugins.precision.bitsandbytes": "bitsandbytes quantisation (CUDA only) is not implemented",
    "lightning.pytorch.plugins.precision.transformer_engine": "NVIDIA Transformer Engine (Hopper GPUs) is not "
    "implemented; phalanx's float8 path is precision='float8' (torchao)",
    "lightning.pytorch.plugins:BitsandbytesPrecision": "bitsandbytes quantisation (CUDA only) is not implemented",
    "lightning.pytorch.plugins:TransformerEnginePrecision": "NVIDIA Transformer Engine is not implemented; "
    "precision='float8' uses torchao",
    "lightning.pytorch.plugins.precision:BitsandbytesPrecision": "bitsandbytes quantisation (CUDA only) is not "
    "implemented",
    "lightning.pytorch.plugins.precision:TransformerEnginePrecision": "NVIDIA Transformer Engine is not "
    "implemented; precision='float8' uses torchao",
    "lightning.pytorch.plugins.precision.fsdp": "the fsdp strategy applies precision='...' through FSDP2's "
    "MixedPrecisionPolicy itself; there is no separate precision class to pass",
    "lightning.pytorch.plugins.precision.deepspeed": "the deepspeed strategy applies precision='...' through the "
    "DeepSpeed config itself; there is no separate precision class to pass",
    "lightning.pytorch.plugins:FSDPPrecision": "the fsdp strategy applies precision='...' itself (FSDP2's "
    "MixedPrecisionPolicy)",
    "lightning.pytorch.plugins:DeepSpeedPrecision": "the deepspeed strategy applies precision='...' itself (the "
    "DeepSpeed config)",
    "lightning.pytorch.plugins.precision:FSDPPrecision": "the fsdp strategy applies precision='...' itself",
    "lightning.pytorch.plugins.precision:DeepSpeedPrecision": "the deepspeed strategy applies precision='...' itself",
    "lightning.pytorch.plugins.precision.double:LightningDoublePrecisionModule": "a deprecated wrapper module; "
    "DoublePrecision converts the model and the inputs without one",
    "lightning.pytorch.plugins.environments:MPIEnvironment": "needs mpi4py; not implemented (use torchrun or srun)",
    "lightning.pytorch.plugins.environments:XLAEnvironment": "phalanx-strategy-xla takes ranks from torch-xla's "
    "runtime in its launcher; there is no environment class",
    "lightning.pytorch.profilers.xla": "the TPU profiler server (torch-xla only) is not implemented",
    "lightning.pytorch.profilers:XLAProfiler": "the TPU profiler server (torch-xla only) is not implemented",
    "lightning.pytorch.profilers.pytorch:RegisterRecordFunction": "a helper inside Lightning's PyTorchProfiler; "
    "phalanx's labels module forwards with record_module_names=True",
    "lightning.pytorch.profilers.pytorch:ScheduleWrapper": "a helper inside Lightning's PyTorchProfiler; phalanx's "
    "steps torch's schedule directly",
    "lightning.pytorch.callbacks.progress.rich_progress:BatchesProcessedColumn": _RICH_COLUMNS,
    "lightning.pytorch.callbacks.progress.rich_progress:CustomBarColumn": _RICH_COLUMNS,
    "lightning.pytorch.callbacks.progress.rich_progress:CustomInfiniteTask": _RICH_COLUMNS,
    "lightning.pytorch.callbacks.progress.rich_progress:CustomProgress": _RICH_COLUMNS,
    "lightning.pytorch.callbacks.progress.rich_progress:CustomTimeColumn": _RICH_COLUMNS,
    "lightning.pytorch.callbacks.progress.rich_progress:MetricsTextColumn": _RICH_COLUMNS,
    "lightning.pytorch.callbacks.progress.rich_progress:ProcessingSpeedColumn": _RICH_COLUMNS,
    "lightning.pytorch.utilities.model_summary.model_summary_deepspeed": "phalanx's one ModelSummary counts "
    "ZeRO-3's partitioned parameters (ds_numel) itself; there is no DeepSpeed variant",
    "lightning.pytorch.utilities.model_summary:DeepSpeedSummary": "phalanx's one ModelSummary counts ZeRO-3's "
    "partitioned parameters itself",
}


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


@dataclass
class ModulePath:
    """One public Lightning module beside ``phalanx.<path>``."""

    lightning: str
    phalanx: str
    names: int
    #: ``present``: imports, every name there or a listed difference; ``partial``: imports, names
    #: missing; ``absent``: does not import; ``difference``: the whole module is a listed difference;
    #: ``unimportable``: Lightning's own module does not import here (an optional dependency).
    status: str
    present: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    needs_plugin: list[str] = field(default_factory=list)
    #: Names that exist but need an optional dependency not installed here (``phalanx-core[cli]``).
    needs_extra: list[str] = field(default_factory=list)
    note: str = ""


def lightning_module_paths() -> list[str]:
    """``lightning.pytorch`` and every module below it with no ``_``-prefixed segment.

    The walk reads the package directories (``pkgutil.iter_modules``) instead of importing each
    package, so the modules of a package that does not import here are still listed.
    """
    import lightning.pytorch as lp

    paths = ["lightning.pytorch"]
    stack = [(list(lp.__path__), "lightning.pytorch")]
    while stack:
        search, prefix = stack.pop()
        for info in pkgutil.iter_modules(search, prefix + "."):
            if info.name.rpartition(".")[2].startswith("_"):
                continue
            paths.append(info.name)
            if info.ispkg:
                stack.append(([str(Path(info.module_finder.path) / info.name.rpartition(".")[2])], info.name))  # type: ignore[union-attr]
    return sorted(set(paths))


def _is_reexport(source_lines: list[str], node: ast.stmt) -> bool:
    line = source_lines[node.lineno - 1]
    return "noqa" in line and "F401" in line


def _module_level_statements(tree: ast.Module) -> list[ast.stmt]:
    """Statements run at import: the body, and the bodies of top-level ``if``/``try`` blocks,
    except ``if TYPE_CHECKING:`` (names bound only for the type checker)."""
    out: list[ast.stmt] = []
    stack = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            stack.extend(reversed(node.body + node.orelse))
        elif isinstance(node, ast.Try):
            stack.extend(
                reversed(node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody)
            )
        else:
            out.append(node)
    return out


def public_names(module: Any) -> set[str]:
    """A module's public names by the rule in this file's docstring (``__all__``, else own bindings
    and ``# noqa: F401`` re-exports)."""
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return {str(name) for name in declared if not str(name).startswith("_")}
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return set()
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    lines = source.splitlines()
    bound: set[str] = set()
    for node in _module_level_statements(ast.parse(source)):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            bound.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            bound.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and _is_reexport(lines, node):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    names = set()
    for name in bound:
        if name.startswith("_") or name == "TYPE_CHECKING" or not hasattr(module, name):
            continue
        value = getattr(module, name)
        if isinstance(value, (logging.Logger, typing.TypeVar, typing.ParamSpec, type(sys))):
            continue
        if name[0].islower() and not (inspect.isclass(value) or inspect.isroutine(value)):
            continue  # module state such as a warning cache; constants are CAPITALS or CapWords aliases
        names.add(name)
    return names


def phalanx_path(lightning_path: str) -> str:
    """``lightning.pytorch.X.Y`` -> ``phalanx.X.Y`` (the rename rule)."""
    return "phalanx" + lightning_path.removeprefix("lightning.pytorch")


def _prefixes(module: str) -> list[str]:
    """``a.b.c`` -> ``["a.b.c", "a.b", "a"]``: the module and the packages above it, nearest first."""
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(len(parts), 0, -1)]


def difference_for(module: str, name: str | None = None) -> str | None:
    """The listed reason phalanx lacks ``module`` (or ``module:name``), if there is one."""
    if name is not None and f"{module}:{name}" in DIFFERENCES:
        return DIFFERENCES[f"{module}:{name}"]
    return next((DIFFERENCES[key] for key in _prefixes(module) if key in DIFFERENCES), None)


def compare_modules() -> list[ModulePath]:
    """Every public Lightning module beside its phalanx namesake."""
    from phalanx.errors import PluginUnavailableError

    results = []
    for path in lightning_module_paths():
        ours_path = phalanx_path(path)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs_module = importlib.import_module(path)
        except Exception as error:  # an optional dependency of Lightning's own module is missing
            results.append(ModulePath(path, ours_path, 0, "unimportable", note=f"{type(error).__name__}: {error}"))
            continue
        theirs = sorted(public_names(theirs_module))
        if difference_for(path) is not None:
            results.append(ModulePath(path, ours_path, len(theirs), "difference", differences=theirs))
            continue
        try:
            ours_module = importlib.import_module(ours_path)
        except ImportError as error:
            results.append(
                ModulePath(
                    path, ours_path, len(theirs), "absent", missing=theirs, note=f"{type(error).__name__}: {error}"
                )
            )
            continue
        entry = ModulePath(path, ours_path, len(theirs), "present")
        for name in theirs:
            try:
                getattr(ours_module, RENAMED.get(name, name))
            except PluginUnavailableError:
                entry.needs_plugin.append(name)
            except ModuleNotFoundError as error:
                entry.needs_extra.append(name)
                entry.note = entry.note or str(error).splitlines()[0]
            except (AttributeError, ImportError):
                (entry.differences if difference_for(path, name) else entry.missing).append(name)
            else:
                entry.present.append(name)
        if entry.missing:
            entry.status = "partial"
        results.append(entry)
    return results


def module_totals(modules: list[ModulePath]) -> dict[str, int]:
    """Names and modules: present, listed differences, missing, all (Lightning's importable ones)."""
    counted = [m for m in modules if m.status != "unimportable"]
    return {
        "names": sum(m.names for m in counted),
        "names_present": sum(len(m.present) + len(m.needs_plugin) + len(m.needs_extra) for m in counted),
        "names_differences": sum(len(m.differences) for m in counted),
        "names_missing": sum(len(m.missing) for m in counted),
        "modules": len(counted),
        "modules_present": sum(m.status == "present" for m in counted),
        "modules_partial": sum(m.status == "partial" for m in counted),
        "modules_differences": sum(m.status == "difference" for m in counted),
        "modules_absent": sum(m.status == "absent" for m in counted),
        "modules_unimportable": len(modules) - len(counted),
    }


def _module_table(modules: list[ModulePath]) -> str:
    totals = module_totals(modules)
    lines = [
        "",
        "Module paths (lightning.pytorch.X -> phalanx.X):",
        f"  names:   {totals['names_present']} of {totals['names']} present "
        f"({100 * totals['names_present'] // max(totals['names'], 1)} %), {totals['names_differences']} deliberate "
        f"differences, {totals['names_missing']} missing",
        f"  modules: {totals['modules_present']} of {totals['modules']} complete, {totals['modules_partial']} partial, "
        f"{totals['modules_differences']} deliberate differences, {totals['modules_absent']} absent"
        + (
            f" ({totals['modules_unimportable']} of Lightning's do not import here)"
            if totals["modules_unimportable"]
            else ""
        ),
    ]
    missing = [m for m in modules if m.status in {"absent", "partial"}]
    if missing:
        lines.append("")
        lines.append("missing:")
        for m in missing:
            what = "module absent" if m.status == "absent" else f"{len(m.missing)} of {m.names} names missing"
            lines.append(f"  {m.phalanx}: {what}" + (f": {', '.join(m.missing)}" if m.missing else ""))
    plugin = [m for m in modules if m.needs_plugin]
    if plugin:
        lines.append("")
        lines.append("present, from a plugin package not installed here:")
        lines.extend(f"  {m.phalanx}: {', '.join(m.needs_plugin)}" for m in plugin)
    extra = [m for m in modules if m.needs_extra]
    if extra:
        lines.append("")
        lines.append("present, needing an optional dependency not installed here:")
        lines.extend(f"  {m.phalanx}: {', '.join(m.needs_extra)} ({m.note})" for m in extra)
    differences = [m for m in modules if m.status == "difference" or m.differences]
    if differences:
        lines.append("")
        lines.append("deliberate differences (DIFFERENCES in tools/lightning_surface.py):")
        whole: dict[str, list[ModulePath]] = {}
        for m in differences:
            if m.status == "difference":
                key = next(k for k in _prefixes(m.lightning) if k in DIFFERENCES)
                whole.setdefault(key, []).append(m)
            else:
                for name in m.differences:
                    lines.append(f"  {m.phalanx}:{name}: {difference_for(m.lightning, name)}")
        for key, members in whole.items():
            below = f" and {len(members) - 1} modules below" if len(members) > 1 else ""
            lines.append(f"  {phalanx_path(key)} (whole module{below}): {DIFFERENCES[key]}")
    unimportable = [m for m in modules if m.status == "unimportable"]
    if unimportable:
        lines.append("")
        lines.append("Lightning's own module does not import here (not counted):")
        lines.extend(f"  {m.lightning}: {m.note}" for m in unimportable)
    return "\n".join(lines)


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
        modules = compare_modules()
    except ImportError as error:
        print(f"lightning_surface: {error}. Run it where both import, e.g. `nox -s lightning`.", file=sys.stderr)
        return 2
    if args.json:
        payload = {
            "versions": versions,
            "groups": [asdict(g) for g in groups],
            "modules": [asdict(m) for m in modules],
            "module_totals": module_totals(modules),
        }
        print(json.dumps(payload, indent=2))
    else:
        print(_table(groups, versions))
        print(_module_table(modules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
