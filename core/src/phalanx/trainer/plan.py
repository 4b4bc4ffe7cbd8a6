"""``Trainer.plan(model)``: check a whole configuration and size it per rank without launching.

``Trainer(...)`` has already resolved and configured the strategy (names, devices, nodes, mesh
sizes, plugin availability). The dry run adds what needs the model: that it is an ``nn.Module``
with the Lightning-style methods it will need, that it can be described on the meta device, which
optimizer ``configure_optimizers`` builds, and what the strategy's plugin estimates one rank holds.
Nothing is launched and no weight is allocated: a model built on the meta device, or one whose
layers come from ``configure_model``, is sized from its shapes.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from torch import nn

from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.planning import PlanReport
    from phalanx.trainer_view import TrainerView

__all__ = ["optimizer_kind", "plan_run"]

#: Mesh sizes passed to the estimate when the configured strategy has them as int attributes.
_MESH_SIZES = (
    "data_parallel_size",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "context_parallel_size",
    "data_parallel_replicate_size",
    "expert_parallel_size",
)

#: torch optimizer class name -> kind in phalanx.memory.OPTIMIZER_STATE_BYTES
_KINDS = {"AdamW": "adamw", "Adam": "adam", "RMSprop": "rmsprop", "Adagrad": "adagrad", "Lion": "lion"}


def optimizer_kind(optimizer: Any) -> str:
    """The state-size kind of a torch optimizer (``SGD`` with momentum keeps one buffer)."""
    name = type(optimizer).__name__
    if name == "SGD":
        momentum = optimizer.param_groups[0].get("momentum", 0) if optimizer.param_groups else 0
        return "sgd_momentum" if momentum else "sgd"
    if name in _KINDS:
        return _KINDS[name]
    msg = (
        f"Trainer.plan cannot size the state of {name}: known optimizers are SGD, Adam, AdamW, RMSprop, Adagrad, "
        "Lion. Fix: pass optimizer='adamw' (or the closest kind) to Trainer.plan."
    )
    raise MisconfigurationError(msg)


def _first_optimizer(configured: Any) -> Any:
    from torch.optim import Optimizer

    if isinstance(configured, Optimizer):
        return configured
    if isinstance(configured, dict):
        return _first_optimizer(configured.get("optimizer"))
    if isinstance(configured, (list, tuple)):
        for item in configured:
            found = _first_optimizer(item)
            if found is not None:
                return found
    return None


def _described(model: nn.Module) -> nn.Module:
    """``model`` itself, or a meta-device copy with ``configure_model``'s layers when it has none yet."""
    from phalanx.model_shapes import build_on_meta

    if any(True for _ in model.parameters()) or not callable(getattr(model, "configure_model", None)):
        return model
    return build_on_meta(lambda: copy.deepcopy(model), where=f"{type(model).__name__}.configure_model")


def plan_run(
    trainer: TrainerView,
    model: Any,
    *,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: str | None = None,
    device_memory: int | str | None = None,
    optimizer: str | None = None,
) -> PlanReport:
    """See :meth:`phalanx.Trainer.plan`."""
    from phalanx.memory import parse_bytes
    from phalanx.model_shapes import summarize_model
    from phalanx.planning import plan_strategies
    from phalanx.registry import StrategyRegistry

    if not isinstance(model, nn.Module):
        msg = f"Trainer.plan(model={model!r:.80}) needs a torch.nn.Module (a phalanx.Module); got {type(model).__name__}."
        raise MisconfigurationError(msg)
    missing = [name for name in ("training_step", "configure_optimizers") if not callable(getattr(model, name, None))]
    if missing:
        msg = f"Trainer.plan: {type(model).__name__} has no {' or '.join(missing)}, which fit needs. Fix: define it."
        raise MisconfigurationError(msg)
    described = _described(model)
    if optimizer is None:
        found = _first_optimizer(described.configure_optimizers())  # type: ignore[operator]
        if found is None:
            msg = (
                f"Trainer.plan: {type(model).__name__}.configure_optimizers returned no torch optimizer. "
                "Fix: return one, or pass optimizer='adamw' to Trainer.plan."
            )
            raise MisconfigurationError(msg)
        optimizer = optimizer_kind(found)
    summary = summarize_model(described, input_shape=input_shape, input_dtype=input_dtype)
    name = trainer.strategy_name
    strategy = trainer.strategy
    params: dict[str, Any] = {}
    if name in StrategyRegistry:
        registered = StrategyRegistry.entry(name).init_params
        params = {key: getattr(strategy, key, value) for key, value in registered.items()}
        if type(strategy).__module__ + ":" + type(strategy).__qualname__ != StrategyRegistry.entry(name).target_path:
            name = type(strategy).__name__
    # Per-block options the estimates account for (set on the strategy, not registered defaults).
    policy = getattr(strategy, "activation_checkpointing_policy", None)
    if policy is None:
        policy = getattr(getattr(strategy, "block_options", None), "activation_checkpointing", None)
    if policy is not None:
        params["activation_checkpointing_policy"] = policy
    for key in _MESH_SIZES:  # resolved mesh sizes a strategy exposes (model_parallel's properties)
        value = getattr(strategy, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            params[key] = value
    return plan_strategies(
        summary,
        [trainer.strategy_name],
        devices=trainer.num_devices,
        num_nodes=int(trainer.num_nodes or 1),
        precision=trainer.precision,
        optimizer=optimizer,
        device_memory=None if device_memory is None else parse_bytes(device_memory),
        init_params={trainer.strategy_name: params},
        device_type=_device_type(trainer),
    )


def _device_type(trainer: Any) -> str:
    """The type of the devices the run would use (``"cpu"``, ``"cuda"``); CUDA when not yet known."""
    try:
        return str(trainer.strategy.root_device.type)
    except Exception:  # a strategy that cannot say before launch: plan for CUDA
        return "cuda"
