"""Name -> component registries, filled lazily by plugins.

A registry maps a user-facing name (``"ddp"``, ``"bf16-mixed"``) to an entry: the target class or a
lazy ``"module:Attr"`` string, a description, default init parameters and the requirements that must
be installed. Listing never imports a target, so ``phalanx strategies`` stays fast and torch-free;
the import happens in :meth:`Registry.get_class` when a name is actually used.

A registry is a plain container: it knows nothing of plugins or entry points. Discovery
(:mod:`phalanx.discovery`) fills the five global registries through the registration hooks, installs
itself as their :meth:`~Registry.fill_on_first_read` callback (so the first read of any of them
loads the installed plugins), takes back what a failing plugin registered with
:meth:`~Registry.remove_plugin`, and tells them which plugins did not load
(:meth:`~Registry.note_unloaded_plugin`) so that an unknown name can be explained.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from phalanx import _metadata
from phalanx._hints import install_hint, likely_provider, providing_distribution
from phalanx.errors import MisconfigurationError, PluginUnavailableError, UnknownNameError, closest_match

TYPE_CHECKING = False  # typing's own flag, without importing typing (mypy reads this name as True)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "AcceleratorRegistry",
    "CheckpointIORegistry",
    "ClusterEnvironmentRegistry",
    "PluginSource",
    "PrecisionRegistry",
    "Registry",
    "RegistryEntry",
    "StrategyRegistry",
    "registering_as",
]


@dataclass(frozen=True)
class PluginSource:
    """Who registered an entry: a plugin's entry point and its distribution."""

    plugin: str
    distribution: str | None = None
    version: str | None = None


_USER = PluginSource(plugin="<runtime>")
_current_source: contextvars.ContextVar[PluginSource] = contextvars.ContextVar("phalanx_source", default=_USER)


@contextlib.contextmanager
def registering_as(source: PluginSource) -> Iterator[None]:
    """Attribute every registration made inside the block to ``source`` (used during discovery)."""
    token = _current_source.set(source)
    try:
        yield
    finally:
        _current_source.reset(token)


@dataclass(frozen=True)
class RegistryEntry:
    """One registered name. Holds no imported object unless registered with a class."""

    name: str
    target: type | str
    description: str
    init_params: Mapping[str, Any]
    requires: tuple[str, ...]
    source: PluginSource
    conflicts: tuple[PluginSource, ...] = field(default=())

    @property
    def target_path(self) -> str:
        """The target as ``"module:Attr"`` whether it was given as a class or a string."""
        if isinstance(self.target, str):
            return self.target
        return f"{self.target.__module__}:{self.target.__qualname__}"

    def unavailable_reason(self) -> str | None:
        """Why this entry cannot be used here, judged from installed metadata only (no import)."""
        if self.conflicts:
            owners = " and ".join(_describe(s) for s in (self.source, *self.conflicts))
            blocked = ",".join(s.plugin for s in self.conflicts)
            return (
                f"the name {self.name!r} is registered by both {owners}; uninstall one of them or block one with "
                f"PHALANX_DISABLE_PLUGINS={blocked}"
            )
        for requirement in self.requires:
            problem = requirement_problem(requirement)
            if problem is not None:
                return problem
        return None

    @property
    def available(self) -> bool:
        """True when :meth:`unavailable_reason` finds nothing wrong."""
        return self.unavailable_reason() is None


def _describe(source: PluginSource) -> str:
    if source.distribution:
        return f"plugin {source.plugin!r} ({source.distribution} {source.version or ''})".replace(" )", ")")
    return f"plugin {source.plugin!r}"


def requirement_problem(requirement: str) -> str | None:
    """Check one PEP 508 requirement against installed metadata; return the problem or ``None``."""
    problem = _metadata.unmet(requirement)
    if problem is None:
        return None
    name, installed = problem
    if installed is None:
        return f"requires {requirement}, which is not installed; fix: pip install '{requirement}'"
    return f"requires {requirement} but {name} {installed} is installed; fix: pip install '{requirement}'"


class Registry:
    """A mapping of names to lazily imported components of one kind.

    Args:
        kind: What the registry holds, in words ("strategy"), used in messages.
        fill: Called once, before the first read, to fill the registry (see
            :meth:`fill_on_first_read`); ``None`` for a registry filled by hand.
    """

    def __init__(self, kind: str, *, fill: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, RegistryEntry] = {}
        self._unloaded: list[tuple[PluginSource, str]] = []
        self._fill = fill
        self._filled = fill is None

    # -- what discovery uses -----------------------------------------------------------------
    def fill_on_first_read(self, fill: Callable[[], None]) -> None:
        """Call ``fill`` once, before the next read; discovery installs itself here.

        Reads made while ``fill`` runs (a registration hook listing names) see the registry as it
        is, so filling never recurses.
        """
        self._fill = fill
        self._filled = False

    def clear(self) -> None:
        """Forget every entry and unloaded-plugin note, and arm the fill callback again."""
        self._entries.clear()
        self._unloaded.clear()
        self._filled = self._fill is None

    def remove_plugin(self, plugin: str) -> list[str]:
        """Drop every name ``plugin`` registered or claimed (its hook failed halfway); return them."""
        removed = [n for n, e in self._entries.items() if e.source.plugin == plugin]
        for name in removed:
            del self._entries[name]
        for name, entry in list(self._entries.items()):
            kept = tuple(s for s in entry.conflicts if s.plugin != plugin)
            if kept != entry.conflicts:
                self._entries[name] = _replace(entry, conflicts=kept)
        return removed

    def names_from(self, plugin: str) -> list[str]:
        """The names ``plugin`` registered, then those it also claimed (recorded conflicts)."""
        owned = [n for n, e in self._entries.items() if e.source.plugin == plugin]
        claimed = [n for n, e in self._entries.items() if any(s.plugin == plugin for s in e.conflicts)]
        return owned + claimed

    def note_unloaded_plugin(self, source: PluginSource, why: str) -> None:
        """Remember that ``source`` did not load, and ``why`` (with its fix), for unknown-name errors.

        A plugin that is blocked, incompatible or fails to import registers nothing, so a user
        asking for one of its names would otherwise only hear "unknown name".
        """
        self._unloaded.append((source, why))

    # -- writing -----------------------------------------------------------------------------
    def register(
        self,
        name: str,
        target: type | str | None = None,
        description: str | None = None,
        override: bool = False,
        *,
        requires: tuple[str, ...] | list[str] | str = (),
        **init_params: Any,
    ) -> Any:
        """Register ``name`` -> ``target`` (a class or ``"module:Attr"``), or decorate a class.

        Matches Lightning's ``StrategyRegistry.register(name, strategy, description=None,
        override=False, **init_params)``; ``requires`` adds PEP 508 requirements judged from
        installed metadata. Inside plugin discovery a second owner of a name is recorded as a
        conflict instead of raising, so one bad plugin cannot break the others.
        """
        if target is None:

            def decorator(cls: type) -> type:
                self.register(name, cls, description, override, requires=requires, **init_params)
                return cls

            return decorator
        if not isinstance(name, str) or not name:
            msg = f"A {self.kind} name must be a non-empty string, got {name!r}; pass e.g. register('my_{self.kind}', ...)"
            raise MisconfigurationError(msg)
        if not isinstance(target, (str, type)):
            msg = (
                f"The target of {self.kind} {name!r} must be a class or a 'module:Attr' string, got "
                f"{type(target).__name__}; pass the class itself, not an instance"
            )
            raise MisconfigurationError(msg)
        if isinstance(target, str) and ":" not in target:
            msg = f"The target {target!r} of {self.kind} {name!r} is not of the form 'module:Attr'; e.g. 'my_pkg.strategy:MyStrategy'"
            raise MisconfigurationError(msg)
        requires_tuple = (requires,) if isinstance(requires, str) else tuple(requires)
        source = _current_source.get()
        if source is _USER:
            self._ensure_loaded()  # a runtime name must see (and not be clobbered by) the plugins' names
        existing = self._entries.get(name)
        if existing is not None and not override:
            if source is not _USER and existing.source is not _USER:
                self._entries[name] = _replace(existing, conflicts=(*existing.conflicts, source))
                return target
            msg = (
                f"The {self.kind} name {name!r} is already registered by {_describe(existing.source)} "
                f"(target {existing.target_path}); pass override=True to replace it or pick another name"
            )
            raise MisconfigurationError(msg)
        doc = description if description is not None else _first_doc_line(target)
        self._entries[name] = RegistryEntry(name, target, doc, dict(init_params), requires_tuple, source)
        return target

    def remove(self, name: str) -> None:
        """Forget ``name``; unknown names raise like :meth:`get`."""
        self._ensure_loaded()
        self.entry(name)
        del self._entries[name]

    # -- reading -----------------------------------------------------------------------------
    def _ensure_loaded(self) -> None:
        if not self._filled and self._fill is not None:
            self._filled = True
            self._fill()

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        self._ensure_loaded()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._ensure_loaded()
        return len(self._entries)

    def names(self) -> list[str]:
        """All registered names, available or not, in registration order."""
        self._ensure_loaded()
        return list(self._entries)

    def entries(self) -> list[RegistryEntry]:
        """All entries in registration order."""
        self._ensure_loaded()
        return list(self._entries.values())

    def available_names(self) -> list[str]:
        """Names whose requirements are installed and that no two plugins claim."""
        return [e.name for e in self.entries() if e.available]

    def entry(self, name: str) -> RegistryEntry:
        """The entry for ``name`` without importing anything; unknown names raise a helpful error."""
        self._ensure_loaded()
        found = self._entries.get(name) if isinstance(name, str) else None
        if found is None:
            raise UnknownNameError(self._unknown_message(name))
        return found

    def _unknown_message(self, name: object) -> str:
        choices = sorted(self._entries)
        parts = [f"Unknown {self.kind} {name!r}."]
        text = name if isinstance(name, str) else str(name)
        unloaded = likely_provider(text, [(s.plugin, s.distribution, (s, why)) for s, why in self._unloaded])
        distribution = providing_distribution(text)
        if distribution is not None and _metadata.version(distribution) is not None:
            distribution = None  # installed: the name is a typo of one of its names, not a missing package
        if unloaded is not None:
            source, why = unloaded
            parts.append(f"{name!r} would come from {_describe(source)}, which is not loaded: {why}.")
        elif distribution is not None:
            parts.append(
                f"{name!r} is provided by {distribution}, which is not installed; fix: {install_hint(distribution)}."
            )
        else:
            match = closest_match(text, choices)
            if match is not None:
                parts.append(f"Did you mean {match!r}?")
        parts.append(f"Available: {', '.join(choices) if choices else '(none)'}.")
        if unloaded is None and self._unloaded:
            others = "; ".join(f"{s.plugin!r}: {why}" for s, why in self._unloaded)
            parts.append(f"Plugins that did not load, one of which may provide it: {others}.")
        elif unloaded is None and distribution is None:
            parts.append("Run `phalanx plugins` to see installed plugins and any that failed to load.")
        return " ".join(parts)

    def get_class(self, name: str) -> type:
        """Import and return the class registered as ``name``, checking availability first."""
        entry = self.entry(name)
        reason = entry.unavailable_reason()
        if reason is not None:
            msg = f"The {self.kind} {name!r} from {_describe(entry.source)} cannot be used: {reason}"
            raise PluginUnavailableError(msg)
        return self._import_target(entry)

    def import_class(self, name: str) -> type:
        """The class registered as ``name``, for ``from phalanx.strategies import <Class>`` and the like.

        As :meth:`get_class`, except that a library the entry requires but that is missing
        (torch-xla, deepspeed) does not stop the import when the plugin's own module imports without
        it: as in Lightning, ``from ... import XLAStrategy`` works and the class fails when it is
        used. Any other problem (two plugins owning the name, a module that does not import) raises
        :meth:`get_class`'s error, which names the requirement to install.
        """
        entry = self.entry(name)
        try:
            return self.get_class(name)
        except PluginUnavailableError as unavailable:
            if entry.conflicts or entry.available:
                raise
            try:
                return self._import_target(entry)
            except PluginUnavailableError:
                raise unavailable from None

    def _import_target(self, entry: RegistryEntry) -> type:
        if not isinstance(entry.target, str):
            return entry.target
        name = entry.name
        module_name, _, attr = entry.target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as err:
            msg = (
                f"The {self.kind} {name!r} from {_describe(entry.source)} points at {entry.target!r}, which failed to "
                f"import: {type(err).__name__}: {err}. Reinstall the plugin's distribution or remove it."
            )
            raise PluginUnavailableError(msg) from err
        return obj  # type: ignore[no-any-return]

    def get(self, name: str, **overrides: Any) -> Any:
        """A new instance of ``name``'s target built with its init params updated by ``overrides``."""
        cls = self.get_class(name)
        params = {**self.entry(name).init_params, **overrides}
        return cls(**params)


class _StrategyRegistry(Registry):
    """The strategy registry, with Lightning's method name for listing."""

    def available_strategies(self) -> list[str]:
        """All registered strategy names (Lightning's spelling of :meth:`names`)."""
        return self.names()


def _replace(entry: RegistryEntry, **changes: Any) -> RegistryEntry:
    import dataclasses

    return dataclasses.replace(entry, **changes)


def _first_doc_line(target: type | str) -> str:
    if isinstance(target, str):
        return ""
    doc = (target.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


# The global registries: empty until discovery fills them (the phalanx package arms them on import).
StrategyRegistry = _StrategyRegistry("strategy")
AcceleratorRegistry = Registry("accelerator")
PrecisionRegistry = Registry("precision")
CheckpointIORegistry = Registry("checkpoint IO")
ClusterEnvironmentRegistry = Registry("cluster environment")
#: Callbacks by name: ``Trainer(callbacks=["early_stopping"])`` builds the registered class.
CallbackRegistry = Registry("callback")
#: Loggers by name: ``Trainer(logger="tensorboard")`` builds the registered class under ``default_root_dir``.
LoggerRegistry = Registry("logger")
#: Every global registry; ``phalanx`` (the package) arms each with plugin discovery.
GLOBAL_REGISTRIES: tuple[Registry, ...] = (
    StrategyRegistry,
    AcceleratorRegistry,
    PrecisionRegistry,
    CheckpointIORegistry,
    ClusterEnvironmentRegistry,
    CallbackRegistry,
    LoggerRegistry,
)
