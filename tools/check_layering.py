"""Enforce the layering rules of DESIGN.md §6 by reading the source (no imports executed).

1. Nothing in core/ imports a plugin package (``phalanx_*``) or a strategy library.
2. ``_plugin.py`` modules import no torch / deepspeed / torch_xla at module level: listing
   strategies runs them and must stay fast and torch-free.
3. A plugin package imports another plugin package only if its pyproject depends on it.
4. No plugin package (packages/*/src, examples/*/src) imports a private core name: a module
   ``phalanx._x`` / ``phalanx.y._x`` or an underscored name from a core module. What a plugin
   needs is public (``phalanx.utilities`` and the contract classes); a vendor could use nothing else.

Exit status 1 with one line per violation; used by the lint session and by core's tests.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "deepspeed", "torch_xla"}
CORE_FORBIDDEN = {"deepspeed", "torch_xla"}


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
    return problems


def main() -> int:
    problems = check()
    for problem in problems:
        print(problem)
    if not problems:
        print("layering: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
