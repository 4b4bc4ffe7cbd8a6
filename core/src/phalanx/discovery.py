"""Plugin discovery and the "auto" decisions, through pluggy's own calling.

Every module named by an entry point of the ``phalanx`` group is a plugin, the core's own
built-ins included (entry point ``builtin``). Each entry point is loaded on its own: one that is
blocked by ``PHALANX_DISABLE_PLUGINS`` (pluggy's ``set_blocked``; it is never imported), needs
another ``phalanx-core``, fails to import, has a hook implementation pluggy rejects, or raises in
a registration hook gets a :class:`PluginRecord` with its reason (``phalanx plugins`` shows it),
and the rest keep working. The calling rules are written down in :mod:`phalanx.hookspecs`.
Nothing here imports torch.
"""

from __future__ import annotations

import inspect
import os
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pluggy

from phalanx import _metadata, hookspecs
from phalanx.errors import MisconfigurationError, PhalanxError, PluginHookError, closest_match
from phalanx.registry import (
    AcceleratorRegistry,
    CallbackRegistry,
    CheckpointIORegistry,
    ClusterEnvironmentRegistry,
    LoggerRegistry,
    PluginSource,
    PrecisionRegistry,
    Registry,
    StrategyRegistry,
    registering_as,
)

if TYPE_CHECKING:
    from importlib.metadata import Distribution, EntryPoint

    from phalanx.environments import ClusterEnvironment

__all__ = [
    "DISABLE_ENV",
    "ENTRY_POINT_GROUP",
    "PluginRecord",
    "convert_checkpoint",
    "decide",
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
    "phalanx_register_callbacks": CallbackRegistry,
    "phalanx_register_loggers": LoggerRegistry,
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


def blocked_names() -> list[str]:
    """Entry-point names listed in ``PHALANX_DISABLE_PLUGINS`` (comma separated)."""
    return [n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()]


def load_plugins() -> None:
    """Discover and register all plugins once per process (later calls return at once)."""
    global _manager
    with _lock:
        if _manager is not None:
            return
        manager = pluggy.PluginManager(ENTRY_POINT_GROUP)
        manager.add_hookspecs(hookspecs)
        for name in blocked_names():
            manager.set_blocked(name)
        _manager = manager  # set first: registration hooks that read a registry must not recurse
        for ep in _sorted_entry_points():
            _records.append(_load_one(manager, ep))
        for record in _records:
            if record.status != "loaded":
                source = PluginSource(record.name, record.distribution, record.version)
                for registry in REGISTRATION_HOOKS.values():
                    registry.note_unloaded_plugin(source, record.reason or record.status)


def _sorted_entry_points() -> list[EntryPoint]:
    """The core's built-ins first, then plugins by distribution and name, for stable conflict reports."""

    def key(ep: EntryPoint) -> tuple[int, str, str]:
        dist = _metadata.distribution_of(ep)
        name = _metadata.canonical_name(dist.name) if dist is not None else ""
        return (0 if name == CORE_DISTRIBUTION else 1, name, ep.name)

    return sorted(_metadata.entry_points(ENTRY_POINT_GROUP), key=key)


def _load_one(manager: pluggy.PluginManager, ep: EntryPoint) -> PluginRecord:
    dist = _metadata.distribution_of(ep)
    record = PluginRecord(
        name=ep.name,
        value=ep.value,
        distribution=dist.name if dist is not None else None,
        version=dist.version if dist is not None else None,
    )
    if manager.is_blocked(ep.name):
        others = [n for n in blocked_names() if n != ep.name]
        unblock = f"{DISABLE_ENV}={','.join(others)}" if others else f"unset {DISABLE_ENV}"
        record.status = "blocked"
        record.reason = f"blocked by {DISABLE_ENV}={os.environ.get(DISABLE_ENV, '')}; fix: {unblock} to load it"
        return record
    problem = _core_incompatibility(dist) if dist is not None else None
    if problem is not None:
        record.status, record.reason = "incompatible", problem
        return record
    try:
        module = cast(ModuleType, ep.load())
    except Exception as err:
        record.status = "failed"
        record.reason = f"import of {ep.value!r} failed: {type(err).__name__}: {err}; fix: reinstall or upgrade {record.distribution}, or block it with {DISABLE_ENV}={ep.name}"
        return record
    problem = _register(manager, module, ep.name)
    if problem is not None:
        record.status, record.reason = "failed", problem
        return record
    record.hooks = sorted(caller.name for caller in manager.get_hookcallers(module) or [])
    _run_registration_hooks(manager, module, record)
    return record


def _register(manager: pluggy.PluginManager, module: ModuleType, name: str) -> str | None:
    """Register ``module`` with pluggy and validate it; return why it was refused, if it was."""
    try:
        manager.register(module, name=name)
    except pluggy.PluginValidationError as err:
        return _describe_invalid(manager, module, name, err)
    except ValueError as err:  # the same module named by two entry points
        return f"could not be registered: {err}".replace("\n", " ")
    try:
        manager.check_pending()  # hooks the spec does not define (earlier plugins all passed this)
    except pluggy.PluginValidationError:
        reason = _describe_unknown_hooks(manager, module, name)
        manager.unregister(module)
        return reason
    refused = _registration_wrapper(manager, module, name)
    if refused is not None:
        manager.unregister(module)
    return refused


def _describe_invalid(manager: pluggy.PluginManager, module: ModuleType, name: str, err: Exception) -> str:
    """One line naming the hook, the arguments pluggy refused and the fix."""
    for attr in dir(module):
        opts = manager.parse_hookimpl_opts(module, attr)
        caller = getattr(manager.hook, (opts or {}).get("specname") or attr, None) if opts else None
        if caller is None or caller.spec is None:
            continue
        passes = [*caller.spec.argnames, *caller.spec.kwargnames]
        required = [
            p.name
            for p in inspect.signature(getattr(module, attr)).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        extra = [arg for arg in required if arg not in passes]
        if extra:
            renames = [f"{arg!r} to {closest_match(arg, passes)!r}" for arg in extra if closest_match(arg, passes)]
            return (
                f"hook {caller.name} takes argument(s) {', '.join(map(repr, extra))}, which it is never passed "
                f"(it is passed: {', '.join(passes) or 'nothing'}); fix: {'rename ' + ', '.join(renames) if renames else 'remove them'} "
                f"in {module.__name__}.{attr}: an implementation takes any subset of the hook's arguments, by name"
            )
    return f"pluggy rejected its hook implementations: {' '.join(str(err).split())}; fix: correct them as described in phalanx.hookspecs"


def _describe_unknown_hooks(manager: pluggy.PluginManager, module: ModuleType, name: str) -> str:
    """One line naming each hook the contract does not define, with the closest real hook."""
    del name
    known = sorted(n for n in dir(hookspecs) if n.startswith("phalanx_"))
    unknown = [
        caller.name
        for caller in manager.get_hookcallers(module) or []
        if not caller.has_spec() and any(i.plugin is module and not i.optionalhook for i in caller.get_hookimpls())
    ]
    hints = [
        f"{n!r} (did you mean {closest_match(n, known)!r}?)" if closest_match(n, known) else repr(n) for n in unknown
    ]
    return (
        f"implements unknown hook(s) {', '.join(hints)}; valid hooks: {', '.join(known)}; fix: rename it to the hook "
        "meant, or mark it @hookimpl(optionalhook=True) if it is meant for a newer phalanx-core"
    )


def _registration_wrapper(manager: pluggy.PluginManager, module: ModuleType, name: str) -> str | None:
    """Refuse wrapper hookimpls on registration hooks: called per plugin, they would wrap nothing."""
    for caller in manager.get_hookcallers(module) or []:
        if caller.name not in REGISTRATION_HOOKS:
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin is module and (impl.wrapper or impl.hookwrapper):
                flag = "wrapper=True" if impl.wrapper else "hookwrapper=True"
                return (
                    f"hook {caller.name} of plugin {name!r} is declared {flag}, but registration hooks are called "
                    f"once per plugin, so a wrapper has nothing to wrap; fix: drop {flag} and register the names "
                    "directly (wrappers are supported on the decision hooks, e.g. phalanx_select_strategy)"
                )
    return None


def _core_incompatibility(dist: Distribution) -> str | None:
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
        if _metadata.unmet(line) is not None:
            spec = line.split(";")[0].strip()
            return (
                f"requires {spec}, but phalanx-core {core_version} is installed; "
                f"fix: upgrade phalanx-core or install a release of {dist.name} built for {core_version}"
            )
    return None


def _run_registration_hooks(manager: pluggy.PluginManager, module: ModuleType, record: PluginRecord) -> None:
    """Call each registration hook for this plugin alone, so its names are attributed to it."""
    source = PluginSource(record.name, record.distribution, record.version)
    others = [plugin for plugin in manager.get_plugins() if plugin is not module]
    for hook_name, registry in REGISTRATION_HOOKS.items():
        if hook_name not in record.hooks:
            continue
        try:
            with registering_as(source):
                manager.subset_hook_caller(hook_name, remove_plugins=others)(registry=registry)
        except Exception as err:
            for reg in REGISTRATION_HOOKS.values():
                reg.remove_plugin(record.name)
            manager.unregister(module)
            record.status = "failed"
            record.reason = (
                f"hook {hook_name} raised {type(err).__name__}: {err}; nothing it registered was kept; "
                f"fix: upgrade {record.distribution or record.name} or block it with {DISABLE_ENV}={record.name}"
            )
            record.provides = {}
            return
    for registry in REGISTRATION_HOOKS.values():
        names = registry.names_from(record.name)
        if names:
            record.provides[registry.kind] = names


def _raising_plugin(caller: pluggy.HookCaller, err: BaseException) -> str | None:
    """The plugin whose hook implementation raised ``err``, found in its traceback.

    pluggy runs the implementations and wrappers of one call in one loop and re-raises what one
    of them raised; the innermost traceback frame that runs an implementation's code is the one
    that raised (a wrapper that replaces the error is found as itself).
    """
    import traceback

    owners = {getattr(impl.function, "__code__", None): impl.plugin_name for impl in caller.get_hookimpls()}
    found = None
    for frame, _ in traceback.walk_tb(err.__traceback__):
        found = owners.get(frame.f_code, found)
    return found


def decide(hook_name: str, **kwargs: Any) -> Any:
    """Call the firstresult hook ``hook_name`` with ``kwargs``; ``None`` when no plugin answers.

    Public so that every module that asks the plugins (the "auto" choices here, the memory
    planner in :mod:`phalanx.planning`) goes through one call with one error: a
    :class:`~phalanx.errors.PluginHookError` naming the plugin that raised and how to block it
    (a :class:`~phalanx.errors.PhalanxError` raised on purpose passes through unchanged).
    """
    caller: pluggy.HookCaller = getattr(get_plugin_manager().hook, hook_name)
    try:
        return caller(**kwargs)
    except PhalanxError:
        raise  # a deliberate, already explained error (e.g. a corrupt checkpoint)
    except Exception as err:
        call = f"{hook_name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
        plugin = _raising_plugin(caller, err)
        if plugin is None:
            names = sorted({impl.plugin_name for impl in caller.get_hookimpls()})
            msg = (
                f"A plugin failed in {call}: {type(err).__name__}: {err}. It is one of {', '.join(names)}; "
                f"fix or upgrade it, or block it with {DISABLE_ENV}=<name>"
            )
        else:
            msg = (
                f"Plugin {plugin!r} failed in {call}: {type(err).__name__}: {err}. "
                f"Fix or upgrade that plugin, or block it with {DISABLE_ENV}={plugin}"
            )
        raise PluginHookError(msg) from err


def select_accelerator_name() -> str:
    """The accelerator ``"auto"`` means here."""
    answer = decide("phalanx_select_accelerator")
    return "cpu" if answer is None else str(answer)


def select_strategy_name(*, accelerator: str, num_devices: int, num_nodes: int, interactive: bool) -> str:
    """The strategy ``"auto"`` means for this accelerator and device count."""
    answer = decide(
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
    answer = decide("phalanx_detect_cluster_environment")
    name = "local" if answer is None else str(answer)
    return ClusterEnvironmentRegistry.get(name)  # type: ignore[no-any-return]


def convert_checkpoint(source: str, destination: str) -> None:
    """Convert any strategy's checkpoint into one portable file, asking each plugin in turn."""
    if decide("phalanx_convert_checkpoint", source=source, destination=destination) is None:
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
            registry.clear()
        _metadata.clear_cache()
