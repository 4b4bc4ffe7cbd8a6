"""``phalanx new KIND NAME DIR``: write a complete plugin package that passes its kit as generated.

The templates are package data (``phalanx/_cli/scaffold/<kind>/`` over the shared
``scaffold/_common/``) rendered with
:class:`string.Template`, so the command needs nothing beyond the standard library and runs in the
same fraction of a second as ``phalanx strategies`` (it reads the registries, never torch). The
generated pyproject pins the ``phalanx-core`` range of the running core and the core's own torch
range, so the package installs where the core that wrote it does.

Bad input is refused before anything is written: a name that is not a lowercase identifier, a
name an installed plugin already uses (as entry point or registered name), or a DIR that exists
and is not empty. Files are written only into a DIR that is new or empty, so nothing a user has
is ever overwritten.
"""

from __future__ import annotations

import keyword
import re
import string
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from importlib.metadata import PackageNotFoundError, requires
from importlib.util import find_spec
from pathlib import Path

from packaging.requirements import Requirement

from phalanx.version import __version__

__all__ = [
    "KINDS",
    "NewPackageError",
    "PluginKind",
    "available_kinds",
    "check_name",
    "core_requirement",
    "render",
    "write_package",
]

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclass(frozen=True)
class PluginKind:
    """One kind of plugin ``phalanx new`` can write.

    Attributes:
        registry: Name of the registry in :mod:`phalanx.registry` whose names a new plugin must not reuse.
        class_suffix: Appended to the CamelCase name to name the generated class.
        noun: The kind in words, for descriptions and messages.
        hook: The registration hook the generated ``_plugin.py`` implements.
        class_module: The generated module holding the class (``src/phalanx_NAME/<class_module>.py``).
        method: The one method the generated class marks FILL IN.
        kit: The conformance kit in :mod:`phalanx.testing` the generated tests subclass.
        kit_attribute: The kit's class attribute naming the plugin under test.
    """

    registry: str
    class_suffix: str
    noun: str
    hook: str
    class_module: str
    method: str
    kit: str
    kit_attribute: str


#: Every kind the command knows; :func:`available_kinds` keeps those whose templates ship.
KINDS: dict[str, PluginKind] = {
    "strategy": PluginKind(
        "StrategyRegistry",
        "Strategy",
        "strategy",
        "phalanx_register_strategies",
        "strategy",
        "post_backward",
        "StrategyConformance",
        "strategy",
    ),
    "accelerator": PluginKind(
        "AcceleratorRegistry",
        "Accelerator",
        "accelerator",
        "phalanx_register_accelerators",
        "accelerator",
        "get_parallel_devices",
        "AcceleratorConformance",
        "accelerator",
    ),
    "precision": PluginKind(
        "PrecisionRegistry",
        "Precision",
        "precision",
        "phalanx_register_precisions",
        "precision",
        "train_step_context",
        "PrecisionConformance",
        "precision",
    ),
    "checkpoint-io": PluginKind(
        "CheckpointIORegistry",
        "CheckpointIO",
        "checkpoint IO",
        "phalanx_register_checkpoint_io",
        "checkpoint_io",
        "save_checkpoint",
        "CheckpointIOConformance",
        "checkpoint_io",
    ),
    "environment": PluginKind(
        "ClusterEnvironmentRegistry",
        "Environment",
        "cluster environment",
        "phalanx_register_cluster_environments",
        "environment",
        "detect",
        "ClusterEnvironmentConformance",
        "cluster_environment",
    ),
    "callback": PluginKind(
        "CallbackRegistry",
        "Callback",
        "callback",
        "phalanx_register_callbacks",
        "callback",
        "on_train_batch_end",
        "CallbackConformance",
        "callback",
    ),
    "logger": PluginKind(
        "LoggerRegistry",
        "Logger",
        "logger",
        "phalanx_register_loggers",
        "logger",
        "log_metrics",
        "LoggerConformance",
        "logger",
    ),
}


class NewPackageError(ValueError):
    """The arguments of ``phalanx new`` cannot make a package; the message says what to pass instead."""


def _templates(kind: str) -> Traversable:
    return resources.files("phalanx._cli.scaffold").joinpath(kind.replace("-", "_"))


def _common() -> Traversable:
    """Files every kind shares (pyproject, conftest, ``__init__``); a kind's own file of the same path wins."""
    return resources.files("phalanx._cli.scaffold").joinpath("_common")


def available_kinds() -> list[str]:
    """The kinds whose templates ship with this core, in :data:`KINDS` order."""
    return [kind for kind in KINDS if _templates(kind).is_dir()]


def core_requirement(version: str = __version__) -> str:
    """``phalanx-core>=X.Y,<...``: the releases with the running core's API (0.x: same minor)."""
    parts = [int(p) for p in re.findall(r"\d+", version)[:2]] + [0, 0]
    major, minor = parts[0], parts[1]
    upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    return f"phalanx-core>={major}.{minor},<{upper}"


def _torch_requirement() -> str:
    """The core's own torch range (from its metadata), so the package installs beside this core."""
    try:
        for line in requires("phalanx-core") or []:
            req = Requirement(line)
            if req.name == "torch" and req.marker is None:
                return str(req)
    except PackageNotFoundError:
        pass
    return "torch>=2.1"


def _taken_names(kind: str) -> dict[str, str]:
    """Installed plugin names (entry points) and the kind's registered names -> who owns them."""
    from phalanx import registry
    from phalanx.discovery import plugin_records

    taken = {r.name: f"the entry point of {r.distribution or 'an installed plugin'}" for r in plugin_records()}
    kind_registry = getattr(registry, KINDS[kind].registry)
    for entry in kind_registry.entries():
        where = entry.source.distribution or entry.source.plugin
        taken.setdefault(entry.name, f"a {KINDS[kind].noun} registered by {where}")
    return taken


def _suggest(name: str, taken: dict[str, str]) -> str:
    base = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "plugin"
    if not base[0].isalpha():
        base = f"my_{base}"
    if keyword.iskeyword(base):
        base = f"{base}_plugin"
    for candidate in (base, f"my_{base}", *(f"my_{base}_{i}" for i in range(2, 100))):
        if candidate not in taken:
            return candidate
    return f"my_{base}_plugin"


def check_name(kind: str, name: str) -> None:
    """Refuse a name that is not a lowercase identifier or that an installed plugin already uses."""
    taken = _taken_names(kind)
    if not _NAME.match(name) or keyword.iskeyword(name):
        msg = (
            f"NAME {name!r} is not a lowercase Python identifier (letters, digits and '_', starting with a "
            f"letter); it becomes the entry point, the registered name and part of the module name. "
            f"Fix: use {_suggest(name, taken)!r}."
        )
        raise NewPackageError(msg)
    if name not in taken and find_spec(f"phalanx_{name}") is not None:
        taken[name] = f"taken: a module 'phalanx_{name}' is already installed"
    if name in taken:
        msg = (
            f"NAME {name!r} is already {taken[name]}; a second plugin with that name would be refused at "
            f"discovery. Fix: use {_suggest(name, taken)!r}, or uninstall the other package first."
        )
        raise NewPackageError(msg)


def _substitutions(kind: str, name: str) -> dict[str, str]:
    noun, suffix = KINDS[kind].noun, KINDS[kind].class_suffix
    module = f"phalanx_{name}"
    camel = "".join(part.capitalize() for part in name.split("_"))
    return {
        "name": name,
        "module": module,
        "distribution": module.replace("_", "-"),
        "class_name": camel if camel.endswith(suffix) else camel + suffix,
        "description": f"The {name} {noun} for phalanx",
        "core_requirement": core_requirement(),
        "torch_requirement": _torch_requirement(),
        "kind": kind,
        "noun": noun,
        "upper": name.upper(),
        "hook": KINDS[kind].hook,
        "class_module": KINDS[kind].class_module,
        "method": KINDS[kind].method,
        "kit": KINDS[kind].kit,
        "kit_attribute": KINDS[kind].kit_attribute,
    }


def _walk(folder: Traversable, prefix: str = "") -> list[tuple[str, Traversable]]:
    found = []
    for child in sorted(folder.iterdir(), key=lambda c: c.name):
        path = f"{prefix}{child.name}"
        if child.is_dir():
            if child.name != "__pycache__":
                found += _walk(child, path + "/")
        elif child.name.endswith(".tmpl"):
            found.append((path, child))
    return found


def render(kind: str, name: str) -> dict[str, str]:
    """Relative path -> text of every file of a new ``kind`` package named ``name`` (nothing written)."""
    values = _substitutions(kind, name)
    files = {}
    templates = dict(_walk(_common())) | dict(_walk(_templates(kind)))
    for path, template in sorted(templates.items()):
        target = path.removesuffix(".tmpl").replace("__module__", values["module"]).replace("__name__", name)
        files[target] = string.Template(template.read_text(encoding="utf-8")).substitute(values)
    return files


def write_package(kind: str, name: str, directory: Path) -> list[Path]:
    """Check the arguments, then write the package into ``directory``; return the files written."""
    if kind not in available_kinds():
        msg = f"KIND {kind!r} has no templates in phalanx-core {__version__}. Fix: use one of {available_kinds()}."
        raise NewPackageError(msg)
    check_name(kind, name)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        what = "a file" if not directory.is_dir() else "a folder that is not empty"
        msg = (
            f"DIR {str(directory)!r} is {what}; phalanx new never overwrites anything. "
            f"Fix: pass a new or empty folder, e.g. {str(directory / _substitutions(kind, name)['distribution'])!r}."
        )
        raise NewPackageError(msg)
    files = render(kind, name)
    written = []
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("x", encoding="utf-8") as handle:  # "x": fail rather than replace a file
            handle.write(text)
        written.append(path)
    return written
