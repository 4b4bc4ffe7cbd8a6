"""Plugin discovery and the "auto" decisions.

Every module named by an entry point of the ``phalanx`` group is a plugin, the core's own
built-ins included (entry point ``builtin``). Each entry point is loaded on its own: one that fails
to import, needs another ``phalanx-core``, is blocked by ``PHALANX_DISABLE_PLUGINS`` or raises in a
registration hook is recorded with its reason (``phalanx plugins`` shows it) and the rest keep
working. Nothing here imports torch.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pluggy

from phalanx import _metadata, hookspecs
from phalanx.errors import MisconfigurationError, PhalanxError, closest_match
from phalanx.registry import (
    AcceleratorRegistry,
    CheckpointIORegistry,
    ClusterEnvironmentRegistry,
    PluginSource,
    PrecisionRegistry,
    Registry,
    StrategyRegistry,
    registering_as,
)

if TYPE_CHECKING:
    from phalanx.environments import ClusterEnvironment

__all__ = [
    "ENTRY_POINT_GROUP",
    "convert_checkpoint",
    "PluginRecord",
    "detect_cluster_environment",
    "get_plugin_manager",
    "load_plugins",
    "plugin_records",
    "select_accelerator_name",
    "select_strategy_name",
]

ENTRY_POINT_GROUP = "phalanx"
DISABLE_ENV = "PHALANX_DISABLE_PLUGINS"
CORE_DISTRIBUTION = "phalanx-core"

REGISTRATION_HOOKS: dict[str, Registry] = {
    "phalanx_register_strategies": StrategyRegistry,
    "phalanx_register_accelerators": AcceleratorRegistry,
    "phalanx_register_precisions": PrecisionRegistry,
    "phalanx_register_checkpoint_io": CheckpointIORegistry,
    "phalanx_register_cluster_environments": ClusterEnvironmentRegistry,
}


@dataclass
class PluginRecord:
    """What discovery learned about one entry point."""

    name: str
    value: str
    distribution: str | None
    version: str | None
    status: str = "loaded"  # loaded | blocked | incompatible | failed
    reason: str | None = None
    hooks: list[str] = field(default_factory=list)
    provides: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form used by ``phalanx plugins --json``."""
        return {
            "entry_point": self.name,
            "value": self.value,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "reason": self.reason,
            "hooks": list(self.hooks),
            "provides": {k: list(v) for k, v in self.provides.items()},
        }


_lock = threading.RLock()
_manager: pluggy.PluginManager | None = None
_records: list[PluginRecord] = []


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every healthy plugin registered."""
    load_plugins()
    assert _manager is not None
    return _manager


def plugin_records() -> list[PluginRecord]:
    """One record per discovered entry point, in load order."""
    load_plugins()
    return list(_records)


def load_plugins() -> None:
    """Discover and register all plugins once per process (later calls return at once)."""
    global _manager
    with _lock:
        if _manager is not None:
            return
        manager = pluggy.PluginManager(ENTRY_POINT_GROUP)
        manager.add_hookspecs(hookspecs)
        _manager = manager
        for registry in REGISTRATION_HOOKS.values():
            registry._loaded = True  # discovery itself fills them; no recursive loading
        blocked = {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}
        for ep in _sorted_entry_points():
            record = _load_one(manager, ep, blocked)
            _records.append(record)


def _sorted_entry_points() -> list[_metadata.EntryPoint]:
    """The core's built-ins first, then plugins by distribution and name, for stable conflict reports."""

    def key(ep: _metadata.EntryPoint) -> tuple[int, str, str]:
        dist = _metadata.canonical_name(ep.dist.name)
        return (0 if dist == CORE_DISTRIBUTION else 1, dist, ep.name)

    return sorted(_metadata.entry_points(ENTRY_POINT_GROUP), key=key)


def _load_one(manager: pluggy.PluginManager, ep: _metadata.EntryPoint, blocked: set[str]) -> PluginRecord:
    dist = ep.dist
    record = PluginRecord(name=ep.name, value=ep.value, distribution=dist.name, version=dist.version)
    if ep.name in blocked:
        record.status, record.reason = "blocked", f"blocked by {DISABLE_ENV}"
        return record
    problem = _core_incompatibility(dist)
    if problem is not None:
        record.status, record.reason = "incompatible", problem
        return record
    try:
        module = cast(ModuleType, ep.load())
    except Exception as err:
        record.status = "failed"
        record.reason = f"import of {ep.value!r} failed: {type(err).__name__}: {err}"
        return record
    try:
        manager.register(module, name=ep.name)
    except Exception as err:
        record.status, record.reason = "failed", f"invalid plugin: {err}"
        return record
    record.hooks = sorted(caller.name for caller in manager.get_hookcallers(module) or [])
    unknown = [name for name in record.hooks if not hasattr(hookspecs, name)]
    if unknown:
        manager.unregister(module)
        known = [n for n in dir(hookspecs) if n.startswith("phalanx_")]
        hints = [f"{n!r} (did you mean {closest_match(n, known)!r}?)" if closest_match(n, known) else repr(n) for n in unknown]
        record.status = "failed"
        record.reason = f"implements unknown hook(s) {', '.join(hints)}; valid hooks: {', '.join(known)}"
        return record
    _run_registration_hooks(manager, module, record)
    return record


def _core_incompatibility(dist: _metadata.Distribution) -> str | None:
    """Return why a plugin's declared ``phalanx-core`` requirement is not met, if it is not."""
    if _metadata.canonical_name(dist.name) == CORE_DISTRIBUTION:
        return None
    core_version = _metadata.version(CORE_DISTRIBUTION)
    if core_version is None:
        return None  # core running from a source tree: nothing to compare against
    for line in dist.requires or []:
        name = line.strip()
        cut = next((i for i, ch in enumerate(name) if not (ch.isalnum() or ch in "-_.")), len(name))
        if _metadata.canonical_name(name[:cut]) != CORE_DISTRIBUTION:
            continue  # cheap pre-filter: only the core requirement matters here
        simple = _metadata.split_requirement(line)
        verdict = None if simple is None else _metadata.satisfies(core_version, simple[1])
        if verdict is None:
            from packaging.requirements import InvalidRequirement, Requirement

            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            verdict = not req.specifier or req.specifier.contains(core_version, prereleases=True)
        if not verdict:
            spec = line.split(";")[0].strip()
            return (
                f"requires {spec}, but phalanx-core {core_version} is installed; "
                f"fix: upgrade phalanx-core or install a release of {dist.name} built for {core_version}"
            )
    return None


def _run_registration_hooks(manager: pluggy.PluginManager, module: ModuleType, record: PluginRecord) -> None:
    source = PluginSource(record.name, record.distribution, record.version)
    for hook_name, registry in REGISTRATION_HOOKS.items():
        function = getattr(module, hook_name, None)
        if function is None:
            continue
        before = set(registry.names())
        try:
            with registering_as(source):
                function(registry=registry)
        except Exception as err:
            for reg in REGISTRATION_HOOKS.values():
                reg._remove_from(record.name)
            manager.unregister(module)
            record.status = "failed"
            record.reason = f"hook {hook_name} raised {type(err).__name__}: {err}"
            record.provides = {}
            return
        added = [n for n in registry.names() if n not in before]
        claimed = [e.name for e in registry.entries() if any(s.plugin == record.name for s in e.conflicts)]
        if added or claimed:
            record.provides[registry.kind] = added + claimed


def _first_answer(hook_name: str, **kwargs: Any) -> Any:
    """Call a firstresult hook, naming the plugin when one of them raises."""
    hook = getattr(get_plugin_manager().hook, hook_name)
    for impl in reversed(hook.get_hookimpls()):
        args = {k: kwargs[k] for k in impl.argnames}
        try:
            result = impl.function(**args)
        except PhalanxError:
            raise  # a deliberate, already explained error (e.g. a corrupt checkpoint)
        except Exception as err:
            msg = (
                f"Plugin {impl.plugin_name!r} failed in {hook_name}({', '.join(f'{k}={v!r}' for k, v in args.items())}): "
                f"{type(err).__name__}: {err}. Fix or upgrade that plugin, or block it with {DISABLE_ENV}={impl.plugin_name}"
            )
            raise PhalanxError(msg) from err
        if result is not None:
            return result
    return None


def select_accelerator_name() -> str:
    """The accelerator ``"auto"`` means here."""
    answer = _first_answer("phalanx_select_accelerator")
    return "cpu" if answer is None else str(answer)


def select_strategy_name(*, accelerator: str, num_devices: int, num_nodes: int, interactive: bool) -> str:
    """The strategy ``"auto"`` means for this accelerator and device count."""
    answer = _first_answer(
        "phalanx_select_strategy",
        accelerator=accelerator,
        num_devices=num_devices,
        num_nodes=num_nodes,
        interactive=interactive,
    )
    if answer is None:
        msg = (
            f"No installed plugin offers a strategy for accelerator={accelerator!r}, devices={num_devices}, "
            f"num_nodes={num_nodes}; pass strategy=... explicitly (see `phalanx strategies`)"
        )
        raise MisconfigurationError(msg)
    return str(answer)


def detect_cluster_environment() -> ClusterEnvironment:
    """An instance of the cluster environment this process runs in (``"local"`` when none)."""
    answer = _first_answer("phalanx_detect_cluster_environment")
    name = "local" if answer is None else str(answer)
    return ClusterEnvironmentRegistry.get(name)  # type: ignore[no-any-return]


def convert_checkpoint(source: str, destination: str) -> None:
    """Convert any strategy's checkpoint into one portable file, asking each plugin in turn."""
    if _first_answer("phalanx_convert_checkpoint", source=source, destination=destination) is None:
        msg = (
            f"No installed plugin recognises the checkpoint {source!r}; expected a torch checkpoint file or a "
            "sharded checkpoint directory written by an installed strategy (see `phalanx plugins`)"
        )
        raise MisconfigurationError(msg)


def _reset_for_tests() -> None:
    """Forget discovery so a test can load plugins again under another environment."""
    global _manager
    with _lock:
        _manager = None
        _records.clear()
        for registry in REGISTRATION_HOOKS.values():
            registry._entries.clear()
            registry._loaded = False
        _metadata._clear_cache()
