"""Turn ``accelerator`` / ``strategy`` / ``devices`` / ``num_nodes`` / ``precision`` / ``plugins``
into one configured Strategy.

Every "auto" is answered by the plugins' ``firstresult`` hooks (``phalanx.plugins``) and every name
is looked up in a registry, so an installed plugin can change what "auto" means or add names
without the core knowing about it. The result is a Strategy whose accelerator, precision,
checkpoint IO and (for parallel strategies) devices, nodes and cluster environment are all filled.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

from phalanx.errors import MisconfigurationError

__all__ = ["ResolvedStrategy", "is_interactive", "resolve_strategy"]

_STRATEGY_EXPECTED = "'auto', a registered strategy name (see `phalanx strategies`) or a Strategy instance"


def is_interactive() -> bool:
    """Whether this is a REPL or notebook, where a script cannot be re-run per rank."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or "ipykernel" in sys.modules


@dataclass(frozen=True)
class ResolvedStrategy:
    """The configured strategy and the names it was resolved from (recorded in checkpoints)."""

    strategy: Any
    strategy_name: str
    accelerator_name: str
    num_devices: int
    num_nodes: int


def _split_plugins(plugins: list[Any]) -> tuple[Any, Any, Any]:
    """Sort ``plugins=`` items into (precision, checkpoint_io, cluster_environment)."""
    from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
    from phalanx.environments.cluster_environment import ClusterEnvironment
    from phalanx.precision.precision import Precision
    from phalanx.registry import CheckpointIORegistry, ClusterEnvironmentRegistry, PrecisionRegistry

    found: dict[str, Any] = {}
    for item in plugins:
        if isinstance(item, str):
            kinds = [
                (kind, registry)
                for kind, registry in (
                    ("precision", PrecisionRegistry),
                    ("checkpoint_io", CheckpointIORegistry),
                    ("cluster_environment", ClusterEnvironmentRegistry),
                )
                if item in registry
            ]
            if not kinds:
                msg = (
                    f"Trainer(plugins=[{item!r}]) names no registered precision, checkpoint IO or cluster "
                    f"environment. Known: precisions {PrecisionRegistry.names()}, checkpoint IO "
                    f"{CheckpointIORegistry.names()}, environments {ClusterEnvironmentRegistry.names()}."
                )
                raise MisconfigurationError(msg)
            kind, registry = kinds[0]
            item = registry.get(item)
        elif isinstance(item, Precision):
            kind = "precision"
        elif isinstance(item, CheckpointIO):
            kind = "checkpoint_io"
        elif isinstance(item, ClusterEnvironment):
            kind = "cluster_environment"
        else:
            msg = (
                f"Trainer(plugins=[{item!r}]) got an object of type {type(item).__name__}; plugins must be "
                "Precision, CheckpointIO or ClusterEnvironment instances or their registered names."
            )
            raise MisconfigurationError(msg)
        if kind in found:
            msg = (
                f"Trainer(plugins=...) holds two {kind} plugins ({found[kind]!r} and {item!r}); pass at most "
                f"one {kind}."
            )
            raise MisconfigurationError(msg)
        found[kind] = item
    return found.get("precision"), found.get("checkpoint_io"), found.get("cluster_environment")


def _resolve_accelerator(accelerator: Any, strategy: Any) -> Any:
    from phalanx.accelerators.accelerator import Accelerator
    from phalanx.plugins import select_accelerator_name
    from phalanx.registry import AcceleratorRegistry

    if isinstance(accelerator, Accelerator):
        return accelerator
    if accelerator == "auto":
        given = getattr(strategy, "accelerator", None) if not isinstance(strategy, str) else None
        if given is not None:
            return given
        accelerator = select_accelerator_name()
    instance = AcceleratorRegistry.get(accelerator)
    if not instance.is_available():
        msg = (
            f"Trainer(accelerator={accelerator!r}): this hardware is not available in this process. "
            "Use accelerator='auto' (picks what is available) or accelerator='cpu'."
        )
        raise MisconfigurationError(msg)
    return instance


def _accelerator_name(accelerator: Any) -> str:
    return str(getattr(accelerator, "name", "") or type(accelerator).__name__.lower().replace("accelerator", ""))


def _precision_plugin(precision: Any, plugin: Any, strategy_given: Any) -> Any:
    from phalanx.precision._aliases import normalize_precision
    from phalanx.precision.precision import Precision
    from phalanx.registry import PrecisionRegistry

    if isinstance(precision, Precision):
        if plugin is not None:
            msg = "Trainer got a Precision both as precision=... and in plugins=...; pass it once."
            raise MisconfigurationError(msg)
        return precision
    name = normalize_precision(precision, extra_choices=PrecisionRegistry.names())
    if plugin is not None:
        if name != "32-true":
            msg = (
                f"Trainer(precision={precision!r}) conflicts with the precision plugin {plugin!r} in plugins=...; "
                "keep only one of them."
            )
            raise MisconfigurationError(msg)
        return plugin
    if strategy_given is not None:
        if name != "32-true" and name != getattr(strategy_given, "precision", None):
            msg = (
                f"Trainer(precision={precision!r}) conflicts with the strategy's own precision_plugin "
                f"{strategy_given!r}; set the precision in one place only."
            )
            raise MisconfigurationError(msg)
        return strategy_given
    return PrecisionRegistry.get(name)


def _build_named_strategy(name: str, devices: list[Any]) -> Any:
    from phalanx.registry import StrategyRegistry

    cls = StrategyRegistry.get_class(name)
    overrides: dict[str, Any] = {}
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    if "device" in params and "device" not in StrategyRegistry.entry(name).init_params:
        overrides["device"] = devices[0]
    return StrategyRegistry.get(name, **overrides)


def _set_if_empty(strategy: Any, attribute: str, value: Any) -> None:
    if hasattr(strategy, attribute) and not getattr(strategy, attribute):
        setattr(strategy, attribute, value)


def resolve_strategy(
    *,
    accelerator: Any,
    strategy: Any,
    devices: Any,
    num_nodes: int,
    precision: Any,
    plugins: list[Any],
    sync_batchnorm: bool,
) -> ResolvedStrategy:
    """Build the configured strategy.

    Raises:
        MisconfigurationError: Invalid or conflicting values.
        UnknownNameError: An unregistered accelerator/strategy/precision name.
        PluginUnavailableError: The name belongs to a plugin that is not installed or usable.
    """
    from phalanx.plugins import select_strategy_name
    from phalanx.strategies.strategy import Strategy

    if not isinstance(strategy, (str, Strategy)):
        msg = (
            f"Trainer(strategy={strategy!r}) (type {type(strategy).__name__}) is invalid: expected "
            f"{_STRATEGY_EXPECTED}. Fix: pass strategy='auto'."
        )
        raise MisconfigurationError(msg)
    precision_plugin, checkpoint_io, environment = _split_plugins(plugins)
    acc = _resolve_accelerator(accelerator, strategy)
    acc_name = _accelerator_name(acc)
    parallel_devices = type(acc).get_parallel_devices(devices)
    num_devices = len(parallel_devices)
    interactive = is_interactive()
    if isinstance(strategy, Strategy):
        instance, name = strategy, type(strategy).strategy_name or type(strategy).__name__
        given_precision = getattr(strategy, "_precision_plugin", None)
    else:
        name = strategy
        if strategy == "auto":
            name = select_strategy_name(
                accelerator=acc_name, num_devices=num_devices, num_nodes=num_nodes, interactive=interactive
            )
        instance = _build_named_strategy(name, parallel_devices)
        given_precision = getattr(instance, "_precision_plugin", None)
    if not hasattr(instance, "parallel_devices") and num_devices * num_nodes > 1:
        msg = (
            f"Trainer(strategy={name!r}) runs one process on one device, but devices={devices!r} and "
            f"num_nodes={num_nodes} ask for {num_devices * num_nodes}. Use strategy='auto' or 'ddp', or devices=1."
        )
        raise MisconfigurationError(msg)
    if instance.accelerator is None:
        instance.accelerator = acc
    instance.precision_plugin = _precision_plugin(precision, precision_plugin, given_precision)
    if checkpoint_io is not None:
        instance.checkpoint_io = checkpoint_io
    _set_if_empty(instance, "parallel_devices", parallel_devices)
    if hasattr(instance, "num_nodes"):
        instance.num_nodes = num_nodes
    if environment is not None and hasattr(instance, "cluster_environment"):
        instance.cluster_environment = environment
    if sync_batchnorm and hasattr(instance, "sync_batchnorm"):
        instance.sync_batchnorm = True
    for method in ("_configure_launcher", "set_world_ranks"):
        if callable(getattr(instance, method, None)):
            getattr(instance, method)()
    launcher = instance.launcher
    if interactive and launcher is not None and not launcher.is_interactive_compatible:
        msg = (
            f"Trainer(strategy={name!r}) re-runs a script per process and cannot work in this interactive "
            "session (notebook/REPL). Fix: use strategy='ddp_notebook' (or 'auto'), or run your code as a script."
        )
        raise MisconfigurationError(msg)
    return ResolvedStrategy(instance, name, acc_name, num_devices, num_nodes)
