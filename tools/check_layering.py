"""Enforce the layering rules of DESIGN.md §6 by reading the source (no imports executed).

1. Nothing in core/ imports a plugin package (``phalanx_*``) or a strategy library.
2. ``_plugin.py`` modules import no torch / deepspeed / torch_xla at module level: listing
   strategies runs them and must stay fast and torch-free.
3. A plugin package imports another plugin package only if its pyproject depends on it.
4. No plugin package (packages/*/src, examples/*/src) imports a private core name: a module
   ``phalanx._x`` / ``phalanx.y._x`` or an underscored name from a core module. What a plugin
   needs is public (``phalanx.utilities`` and the contract classes); a vendor could use nothing else.
5. The core's import graph, built from *every* import (module level, function-local and under
   ``if TYPE_CHECKING:``, absolute and relative), has no cycle, and no module imports one of a
   higher layer of ``LAYERS``. Lazy and type-only imports count: they hide a cycle from Python,
   not from the reader, and they are how a lower layer ends up depending on a higher one.
6. No core module except ``phalanx/trainer/trainer.py`` reaches into a private attribute of
   another object (``trainer._call_hooks``, ``getattr(module, "_trainer")``): what crosses an
   object boundary is a public name, so refactoring one class cannot silently break another.
7. No plugin package class uses a private member it inherits from a core class (``self._module``
   of ``Strategy``, ``self._process_group_backend`` of ``ParallelStrategy``): a vendor's subclass
   cannot rely on the core's private fields either, so the core offers a public or documented
   protected accessor. A package's own private names are its own business, but not one that
   shadows a core base class's (the two would share one attribute by accident).

Exit status 1 with one line per violation; used by the lint session and by core's tests.
``--graph`` prints each core module's layer and imports instead (for docs and for planning moves).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "deepspeed", "torch_xla"}
CORE_FORBIDDEN = {"deepspeed", "torch_xla"}

# The core's layers, bottom to top: (short name, module-name prefixes). A module belongs to the
# layer of its longest matching entry; entries match whole dotted components ("phalanx.trainer"
# matches phalanx.trainer and phalanx.trainer.x, not phalanx.trainer_view). "pkg.*" matches only
# the modules below pkg (not pkg/__init__.py); "pkg.__init__" matches only pkg/__init__.py.
# Entries naming modules that do not exist (yet) are fine: this is the target layout.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations (torch-free)", ("phalanx.errors", "phalanx._hints", "phalanx._metadata", "phalanx.registry", "phalanx._byte_sizes", "phalanx._optimizer_bytes",
                                  "phalanx.version", "phalanx.trainer_view", "phalanx.hooks", "phalanx.memory",
                                  "phalanx.utilities.enums", "phalanx._registered_classes")),
    ("helpers", ("phalanx._empty_init", "phalanx._module_hooks", "phalanx.model_shapes", "phalanx.utilities.*")),
    ("contracts", ("phalanx.accelerators", "phalanx.precision", "phalanx.checkpoint_io", "phalanx.environments",
                   "phalanx.plugins.layer_sync")),
    ("plugin machinery", ("phalanx.hookspecs", "phalanx.discovery", "phalanx.planning")),
    ("launchers", ("phalanx.launchers",)),
    ("strategies", ("phalanx.strategies",)),
    ("module, callbacks, loggers", ("phalanx.module", "phalanx.callbacks", "phalanx.loggers", "phalanx.hparams",
                                    "phalanx.datamodule", "phalanx.profilers", "phalanx.saving",
                                    "phalanx._module_export")),
    ("trainer", ("phalanx.trainer",)),
    ("tools and façades", ("phalanx._builtin", "phalanx.testing", "phalanx._cli", "phalanx.cli", "phalanx.tuner",
                           "phalanx.utilities", "phalanx.__init__",
                           # Lightning's module paths (the rename rule) that re-export from any layer below
                           "phalanx.core", "phalanx.loops", "phalanx.plugins", "phalanx.utilities.parsing",
                           "phalanx.utilities.model_summary", "phalanx.utilities.deepspeed", "phalanx.demos")),
)  # fmt: skip

# Rule 6 is waived for the Trainer itself: it owns the private state the rule protects.
PRIVATE_REACH_EXEMPT = {"phalanx/trainer/trainer.py"}

# Rule 6: third-party internals read through an *instance* (attributes of a module imported from
# outside phalanx, like os._exit or torch._C, are allowed anyway): (path under core/src, attribute),
# each with why. Keep it minimal and never list phalanx's own objects: those are what rule 6 catches.
ALLOWED_PRIVATE_REACH: set[tuple[str, str]] = {
    # Tensor._base: a view's storage owner; tracing saved activations must count each storage once.
    ("phalanx/model_shapes.py", "_base"),
    # Mock._mock_wraps: the callable a mock wraps; unittest.mock has no public accessor for it.
    ("phalanx/utilities/model_helpers.py", "_mock_wraps"),
    # torch's flag on fused optimizers that unscale inside step(); torch's GradScaler reads it the same way.
    ("phalanx/precision/amp.py", "_step_supports_amp_scaling"),
    # DataLoader's kept iterator (persistent workers): torch has no public call that stops its workers,
    # and CombinedLoader.reset() must (Lightning's does the same).
    ("phalanx/utilities/combined_loader.py", "_iterator"),
    ("phalanx/utilities/combined_loader.py", "_shutdown_workers"),
}
# namedtuple's documented API: underscored only to stay clear of field names, public on any namedtuple.
NAMEDTUPLE_API = {"_asdict", "_fields", "_field_defaults", "_make", "_replace"}


def _imports(tree: ast.AST, *, top_level_only: bool) -> Iterator[tuple[int, str]]:
    """Yield (line, top-level module name) of imports; optionally skip those inside functions."""
    nodes = _module_level(tree) if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module.split(".")[0]


def _private_core_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Yield (line, dotted name) of every private core module or name imported anywhere in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_private_core(alias.name):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _is_private_core(node.module):
                yield node.lineno, node.module
            elif node.module.split(".")[0] == "phalanx":
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.endswith("__"):
                        yield node.lineno, f"{node.module}.{alias.name}"


def _is_private_core(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "phalanx" and any(part.startswith("_") for part in parts[1:])


def _plugin_sources(root: Path) -> list[Path]:
    """Every source file of a plugin package: in-repo packages and example vendor packages."""
    return [*sorted((root / "packages").glob("*/src/**/*.py")), *sorted((root / "examples").glob("*/src/**/*.py"))]


def _module_level(tree: ast.AST) -> Iterator[ast.AST]:
    """Nodes executed at import time: everything except function bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.append(child)


def _parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _core_modules(root: Path) -> dict[str, Path]:
    """Map each core module's dotted name to its file; a package's ``__init__`` takes the package name."""
    src = root / "core" / "src"
    modules: dict[str, Path] = {}
    for path in sorted((src / "phalanx").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(dotted: str, modules: dict[str, Path]) -> str:
    """The module an import of ``dotted`` runs: the longest existing prefix (a name inside a module
    resolves to the module); ``dotted`` itself if nothing exists, so layers still apply to it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return dotted


def _imported_modules(node: ast.AST, module: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Core modules one import statement depends on. ``from pkg import x`` names the submodule
    ``pkg.x`` when it exists (that is what runs), else ``pkg``; relative imports resolve against
    the importing module's package."""
    if isinstance(node, ast.Import):
        yield from (_resolve(alias.name, modules) for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            package = package[: max(0, len(package) - node.level + 1)]
            base = ".".join([*package, *([node.module] if node.module else [])])
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            yield submodule if submodule in modules else _resolve(base, modules)


def import_graph(root: Path = ROOT) -> dict[str, dict[str, list[int]]]:
    """Core module -> core module it imports -> lines of those imports, from every import in the file."""
    modules = _core_modules(root)
    graph: dict[str, dict[str, list[int]]] = {name: {} for name in modules}
    for name, path in modules.items():
        for node in ast.walk(_parse(path)):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported_modules(node, name, path, modules):
                if target != name and target.split(".")[0] == "phalanx":
                    graph[name].setdefault(target, []).append(node.lineno)
    return {name: {t: sorted(set(lines)) for t, lines in targets.items()} for name, targets in graph.items()}


def layer_of(module: str) -> int | None:
    """Index in ``LAYERS`` of the longest entry matching ``module``; ``pkg.*`` beats ``pkg`` for
    pkg's submodules, which is what lets a façade package sit above its own helpers."""
    matches = []  # (components matched, marked "pkg.*"/"pkg.__init__", layer)
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            base = entry.removesuffix(".*").removesuffix(".__init__")
            below, itself = module.startswith(base + "."), module == base
            if below if entry.endswith(".*") else itself if entry.endswith(".__init__") else below or itself:
                matches.append((base.count("."), entry != base, index))
    return max(matches)[2] if matches else None


def _strongly_connected(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """Components of mutually reachable modules with more than one member, i.e. the import cycles.
    Plain reachability sets: a few hundred modules make that instant and much easier to read than Tarjan."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, stack = set(), [start]
        while stack:
            for target in graph.get(stack.pop(), {}):
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        reach[start] = seen
    components: list[list[str]] = []
    for module in sorted(graph):
        members = sorted({module} | {other for other in reach[module] if module in reach.get(other, ())})
        if len(members) > 1 and members not in components:
            components.append(members)
    return components


def _cycle_path(members: list[str], graph: dict[str, dict[str, list[int]]]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside the component),
    so the message shows one concrete loop rather than just a set of names."""
    start, inside = members[0], set(members)
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        current = queue.popleft()
        for target in sorted(graph[current]):
            if target == start:
                path = [current]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if target in inside and target not in previous:
                previous[target] = current
                queue.append(target)
    msg = f"{members!r} is not a cycle of the import graph"
    raise ValueError(msg)


def _graph_problems(root: Path) -> list[str]:
    """Rule 5: cycles in the core import graph, imports from a lower layer up, modules with no layer."""
    modules, graph = _core_modules(root), import_graph(root)

    def where(module: str, line: int) -> str:
        return f"{modules[module].relative_to(root)}:{line}"

    problems = []
    for members in _strongly_connected(graph):
        path = _cycle_path(members, graph)
        steps = " -> ".join([path[0], *(f"{b} ({where(a, graph[a][b][0])})" for a, b in pairwise(path))])
        problems.append(
            f"{where(path[0], graph[path[0]][path[1]][0])}: import cycle among {len(members)} core modules "
            f"({', '.join(members)}), e.g. {steps}: move the shared name down a layer to break it"
        )
    for module, targets in graph.items():
        layer = layer_of(module)
        if layer is None:
            problems.append(
                f"{where(module, 1)}: {module} matches no layer: add it to LAYERS in tools/check_layering.py"
            )
            continue
        for target, lines in targets.items():
            higher = layer_of(target)
            if higher is not None and higher > layer:
                problems.extend(
                    f"{where(module, line)}: {module} (layer {layer} {LAYERS[layer][0]!r}) imports {target} "
                    f"(layer {higher} {LAYERS[higher][0]!r}): a lower layer must not import a higher one; "
                    "move the shared name down"
                    for line in lines
                )
    return problems


def _is_private(name: str) -> bool:
    """``_x`` and ``__x`` are private; dunders and namedtuple's ``_asdict``-style API are not."""
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and len(name) > 1 and not dunder and name not in NAMEDTUPLE_API


def _outside_names(tree: ast.AST) -> set[str]:
    """Names bound by imports from outside phalanx (``import os``, ``from torch import nn``): their
    internals (``os._exit``, ``torch._C``) are third-party business, not a reach across our objects."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] != "phalanx")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] != "phalanx":
            names.update(a.asname or a.name for a in node.names if a.name != "*")
    return names


def _is_own_or_outside(obj: ast.expr, outside: set[str]) -> bool:
    """Whether ``obj._x`` is fine: ``obj`` is the object itself (``self``, ``cls``, ``super()``,
    ``type(self)``) or an attribute/call chain rooted at a module imported from outside phalanx
    (``std_mp.current_process()._inheriting``): what such a chain yields is a third-party object."""
    if isinstance(obj, ast.Name) and obj.id in {"self", "cls"}:
        return True
    if isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id in {"super", "type"}:
        return obj.func.id == "super" or (len(obj.args) == 1 and _is_own_or_outside(obj.args[0], set()))
    while isinstance(obj, (ast.Attribute, ast.Call)):
        obj = obj.value if isinstance(obj, ast.Attribute) else obj.func
    return isinstance(obj, ast.Name) and obj.id in outside


def _private_reaches(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Yield (line, attribute) of ``x._name`` and ``getattr/hasattr/setattr/delattr(x, "_name")``
    where ``x`` is another object."""
    outside = _outside_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr) and not _is_own_or_outside(node.value, outside):
            yield node.lineno, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "hasattr", "setattr", "delattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
            and not _is_own_or_outside(node.args[0], outside)
        ):
            yield node.lineno, node.args[1].value


def _reach_problems(root: Path) -> list[str]:
    """Rule 6 over core/src/phalanx, minus the Trainer's own file and ``ALLOWED_PRIVATE_REACH``."""
    src, problems = root / "core" / "src", []
    for path in sorted((src / "phalanx").rglob("*.py")):
        relative = path.relative_to(src).as_posix()
        if relative in PRIVATE_REACH_EXEMPT:
            continue
        for line, name in sorted(set(_private_reaches(_parse(path)))):
            if (relative, name) not in ALLOWED_PRIVATE_REACH:
                problems.append(
                    f"{path.relative_to(root)}:{line}: reaches into private attribute {name!r} of another object; "
                    "use a public name (TrainerView, Run, ...)"
                )
    return problems


def _class_privates(tree: ast.AST) -> dict[str, tuple[list[str], set[str]]]:
    """Each class of a module: (its bases' simple names, the private names it defines itself:
    ``self._x = ...`` assignments, private class attributes and methods)."""
    found: dict[str, tuple[list[str], set[str]]] = {}
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        bases = [base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "") for base in cls.bases]
        own: set[str] = set()
        for statement in cls.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(statement.name):
                own.add(statement.name)
            targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
            own.update(t.id for t in targets if isinstance(t, ast.Name) and _is_private(t.id))
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and _is_private(node.attr)
            ):
                own.add(node.attr)
        found[cls.name] = (bases, own)
    return found


def _inherited_privates(classes: dict[str, tuple[list[str], set[str]]], name: str, seen: set[str]) -> set[str]:
    """The private names class ``name`` gets from its bases (and theirs), as far as ``classes`` knows them."""
    if name in seen or name not in classes:
        return set()
    seen.add(name)
    names: set[str] = set()
    for base in classes[name][0]:
        if base in classes:
            names |= classes[base][1] | _inherited_privates(classes, base, seen)
    return names


def _inherited_private_problems(root: Path) -> list[str]:
    """Rule 7 over packages/*/src and examples/*/src.

    A package's classes are read together (a subclass and its base often live in two files), and
    a class's package-local bases, mixins included, are checked with it: their methods run on the
    same ``self``, so a mixin mixed into a core subclass may not use that core class's privates either.
    """
    core: dict[str, tuple[list[str], set[str]]] = {}
    for path in sorted((root / "core" / "src" / "phalanx").rglob("*.py")):
        core.update(_class_privates(_parse(path)))
    by_package: dict[Path, list[Path]] = {}
    for path in _plugin_sources(root):
        package = path.parents[len(path.relative_to(root).parts) - 3]  # packages/<name> or examples/<name>
        by_package.setdefault(package, []).append(path)
    found: set[tuple[str, int, str, str]] = set()
    for paths in by_package.values():
        local: dict[str, tuple[list[str], set[str]]] = {}
        classes: dict[str, tuple[Path, ast.ClassDef]] = {}
        for path in paths:
            tree = _parse(path)
            local.update(_class_privates(tree))
            classes.update((node.name, (path, node)) for node in ast.walk(tree) if isinstance(node, ast.ClassDef))
        for name in classes:
            # What the class inherits from core classes, and its package-local bases (same self).
            inherited: set[str] = set()
            family, pending = [], [name]
            while pending:
                current = pending.pop()
                if current in family:
                    continue
                family.append(current)
                for base in local.get(current, ([], set()))[0]:
                    if base in local and base != current:
                        pending.append(base)
                    elif base in core:
                        inherited |= core[base][1] | _inherited_privates(core, base, set())
            for member in family:
                path, cls = classes[member]
                found.update(
                    (str(path.relative_to(root)), node.lineno, member, node.attr)
                    for node in ast.walk(cls)
                    if isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                    and node.attr in inherited
                )
    return [
        f"{path}:{line}: {cls} uses {name!r}, a private member of its core base "
        "class; use (or add to the core) a public or documented protected accessor"
        for path, line, cls, name in sorted(found)
    ]


def format_graph(root: Path = ROOT) -> str:
    """Each core module under its layer, with the modules it imports and their layers (for docs)."""
    graph = import_graph(root)
    rows = []
    for index, name in [*enumerate(name for name, _ in LAYERS), ("?", "matches no layer: add it to LAYERS")]:
        members = [module for module in sorted(graph) if layer_of(module) == (None if index == "?" else index)]
        rows.extend([f"[{index}] {name}"] if members else [])
        for module in members:
            imports = ", ".join(f"{t} [{'?' if layer_of(t) is None else layer_of(t)}]" for t in sorted(graph[module]))
            rows.append(f"  {module}" + (f" -> {imports}" if imports else ""))
    return "\n".join(rows)


def check(root: Path = ROOT) -> list[str]:
    """Return the violations found under ``root``."""
    problems: list[str] = []
    for path in sorted((root / "core" / "src").rglob("*.py")):
        tree = _parse(path)
        for line, name in _imports(tree, top_level_only=False):
            if name.startswith("phalanx_") or name in CORE_FORBIDDEN:
                problems.append(f"{path.relative_to(root)}:{line}: core imports plugin-side module {name!r}")
    plugin_files = [
        *sorted((root / "packages").glob("*/src/*/_plugin.py")),
        *sorted((root / "examples").glob("*/src/*/_plugin.py")),
        *(root / "core" / "src").rglob("_plugin.py"),
    ]
    for path in plugin_files:
        for line, name in _imports(_parse(path), top_level_only=True):
            if name in HEAVY:
                problems.append(f"{path.relative_to(root)}:{line}: _plugin.py imports {name!r} at module level")
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        meta = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        deps = " ".join(meta.get("dependencies", [])).replace("-", "_")
        own = meta["name"].replace("-", "_")
        for path in sorted((pyproject.parent / "src").rglob("*.py")):
            for line, name in _imports(_parse(path), top_level_only=False):
                if name.startswith("phalanx_") and name != own and name not in deps:
                    problems.append(
                        f"{path.relative_to(root)}:{line}: imports {name!r} but {pyproject.relative_to(root)} does not depend on it"
                    )
    for path in _plugin_sources(root):
        for line, name in _private_core_imports(_parse(path)):
            problems.append(
                f"{path.relative_to(root)}:{line}: imports the private core name {name!r}; plugins use public names "
                "only (phalanx.utilities, phalanx.strategies, ...): make it public in the core instead"
            )
    return [*problems, *_graph_problems(root), *_reach_problems(root), *_inherited_private_problems(root)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="print each core module's layer and imports, then exit")
    if parser.parse_args(argv).graph:
        print(format_graph())
        return 0
    problems = check()
    for problem in problems:
        print(problem)
    if not problems:
        print("layering: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
