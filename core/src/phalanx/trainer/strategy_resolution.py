"""Turn ``accelerator`` / ``strategy`` / ``devices`` / ``num_nodes`` / ``precision`` / ``plugins``
into one configured Strategy.

Every "auto" is answered by the plugins' ``firstresult`` hooks (``phalanx.discovery``) and every name
is looked up in a registry, so an installed plugin can change what "auto" means or add names
without the core knowing about it. The result is a Strategy whose accelerator, precision,
checkpoint IO and (for parallel strategies) devices, nodes and cluster environment are all filled.
"""

from __future__ import annotations

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


def _split_plugins(plugins: list[Any]) -> tuple[Any, Any, Any, Any]:
    """Sort ``plugins=`` items into (precision, checkpoint_io, cluster_environment, layer_sync)."""
    from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
    from phalanx.environments.cluster_environment import ClusterEnvironment
    from phalanx.plugins.layer_sync import LayerSync
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
                    f"{CheckpointIORegistry.names()}, environments {ClusterEnvironmentRegistry.names()}. Fix: pass one "
                    "of those names or an instance, or install the plugin that provides it (`phalanx plugins`)."
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
        elif isinstance(item, LayerSync):
            kind = "layer_sync"
        else:
            msg = (
                f"Trainer(plugins=[{item!r}]) got an object of type {type(item).__name__}; plugins must be "
                "Precision, CheckpointIO, ClusterEnvironment or LayerSync instances or their registered names. Fix: pass e.g. "
                "plugins=[AsyncCheckpointIO()] or plugins=['bf16-mixed']."
            )
            raise MisconfigurationError(msg)
        if kind in found:
            msg = (
                f"Trainer(plugins=...) holds two {kind} plugins ({found[kind]!r} and {item!r}); pass at most "
                f"one {kind}."
            )
            raise MisconfigurationError(msg)
        found[kind] = item
    return found.get("precision"), found.get("checkpoint_io"), found.get("cluster_environment"), found.get("layer_sync")


def _resolve_accelerator(accelerator: Any, strategy: Any) -> Any:
    from phalanx.accelerators.accelerator import Accelerator
    from phalanx.discovery import select_accelerator_name
    from phalanx.registry import AcceleratorRegistry

    if isinstance(accelerator, Accelerator):
        return accelerator
    if accelerator == "auto":
        given = strategy.accelerator if not isinstance(strategy, str) else None
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
        if name != "32-true" and name != strategy_given.precision:
            msg = (
                f"Trainer(precision={precision!r}) conflicts with the strategy's own precision_plugin "
                f"{strategy_given!r}; set the precision in one place only."
            )
            raise MisconfigurationError(msg)
        return strategy_given
    return PrecisionRegistry.get(name)


def _strategy_from_registry(name: str) -> Any:
    """Instantiate the registered strategy ``name``, refusing a target that breaks the contract."""
    from phalanx.registry import StrategyRegistry
    from phalanx.strategies.strategy import Strategy

    cls = StrategyRegistry.get_class(name)
    source = StrategyRegistry.entry(name).source
    where = f"registered as {name!r} by plugin {source.plugin!r}" + (
        f" ({source.distribution})" if source.distribution else ""
    )
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        msg = (
            f"The strategy {where} is {cls!r}, which is not a phalanx Strategy class. Fix: make it subclass "
            "phalanx.strategies.ParallelStrategy (one process per device) or Strategy, or register the right class."
        )
        raise MisconfigurationError(msg)
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        msg = (
            f"The strategy class {cls.__qualname__} {where} does not implement {', '.join(missing)}, which the "
            "Strategy contract requires (docs/plugins.md). Fix: implement them, or subclass "
            "phalanx.strategies.ParallelStrategy, which implements all of them."
        )
        raise MisconfigurationError(msg)
    return StrategyRegistry.get(name)


def _process_group_exists() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


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
    """Build the strategy and configure it with one :class:`StrategyConfiguration`.

    Raises:
        MisconfigurationError: Invalid or conflicting values, or a world that nothing would launch.
        UnknownNameError: An unregistered accelerator/strategy/precision name.
        PluginUnavailableError: The name belongs to a plugin that is not installed or usable.
    """
    from phalanx.discovery import select_strategy_name
    from phalanx.strategies.configuration import StrategyConfiguration
    from phalanx.strategies.strategy import Strategy

    if not isinstance(strategy, (str, Strategy)):
        msg = (
            f"Trainer(strategy={strategy!r}) (type {type(strategy).__name__}) is invalid: expected "
            f"{_STRATEGY_EXPECTED}. Fix: pass strategy='auto'."
        )
        raise MisconfigurationError(msg)
    precision_plugin, checkpoint_io, environment, layer_sync = _split_plugins(plugins)
    acc = _resolve_accelerator(accelerator, strategy)
    acc_name = _accelerator_name(acc)
    parallel_devices = type(acc).get_parallel_devices(devices)
    num_devices = len(parallel_devices)
    interactive = is_interactive()
    if isinstance(strategy, Strategy):
        instance, name = strategy, type(strategy).strategy_name or type(strategy).__name__
    else:
        name = strategy
        if strategy == "auto":
            name = select_strategy_name(
                accelerator=acc_name, num_devices=num_devices, num_nodes=num_nodes, interactive=interactive
            )
        instance = _strategy_from_registry(name)
    given_precision = instance.precision_plugin if instance.has_precision_plugin else None
    config = StrategyConfiguration(
        strategy_name=name,
        accelerator=acc,
        parallel_devices=tuple(parallel_devices),
        num_nodes=num_nodes,
        precision_plugin=_precision_plugin(precision, precision_plugin, given_precision),
        checkpoint_io=checkpoint_io,
        cluster_environment=environment,
        sync_batchnorm=sync_batchnorm or layer_sync is not None,
        layer_sync=layer_sync,
        devices=devices,
    )
    instance.configure(config)
    launcher = instance.launcher
    if instance.world_size > 1 and launcher is None and not _process_group_exists():
        msg = (
            f"Trainer(strategy={name!r}): {type(instance).__name__} reports world_size={instance.world_size} "
            f"(devices={devices!r}, num_nodes={num_nodes}), but it has no launcher to start the processes and no process "
            "group exists, so training would silently run in one process. Fix: subclass "
            "phalanx.strategies.ParallelStrategy (it launches and joins the process group itself), return a "
            "Launcher from the strategy's `launcher`, or start the job with torchrun."
        )
        raise MisconfigurationError(msg)
    if interactive and launcher is not None and not launcher.is_interactive_compatible:
        msg = (
            f"Trainer(strategy={name!r}) re-runs a script per process and cannot work in this interactive "
            "session (notebook/REPL). Fix: use strategy='ddp_notebook' (or 'auto'), or run your code as a script."
        )
        raise MisconfigurationError(msg)
    return ResolvedStrategy(instance, name, acc_name, num_devices, num_nodes)
