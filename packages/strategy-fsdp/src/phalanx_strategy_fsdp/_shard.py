"""Apply FSDP2 to a model: activation checkpointing, ``fully_shard`` per unit, then materialise.

The order is fixed by FSDP2. Activation checkpointing goes first, since it only registers hooks
on the chosen modules. Inner units are sharded before the units that contain them and the root
last, so that each parameter belongs to the innermost unit that names it. Meta tensors are
materialised after sharding, when each parameter already describes only this rank's shard.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from phalanx.strategies.sharded import has_meta_tensors, materialize_meta, modules_needing_init
from phalanx_strategy_fsdp._fsdp2 import fully_shard
from phalanx_strategy_fsdp._policy import ModuleClassPolicy, ModulePredicate, matching_modules

__all__ = ["apply_activation_checkpointing", "shard_module"]


def apply_activation_checkpointing(model: nn.Module, policy: ModuleClassPolicy | ModulePredicate | None) -> int:
    """Recompute the activations of every matching module in backward instead of storing them.

    Uses the composable ``checkpoint`` API, which keeps parameter names unchanged (a wrapper module
    would insert ``_checkpoint_wrapped_module`` into every name and break checkpoint compatibility
    with runs that did not checkpoint activations).

    Returns:
        How many modules were set up for recomputation.
    """
    modules = matching_modules(model, policy)
    if not modules:
        return 0
    from torch.distributed._composable import checkpoint  # heavy import, only when used

    for module in modules:
        checkpoint(module)
    return len(modules)


def shard_module(
    model: nn.Module,
    *,
    mesh: DeviceMesh,
    wrap_policy: ModuleClassPolicy | ModulePredicate | None,
    activation_checkpointing: ModuleClassPolicy | ModulePredicate | None,
    init_device: torch.device,
    fully_shard_kwargs: dict[str, Any],
) -> nn.Module:
    """Shard ``model`` in place over ``mesh`` and return it (FSDP2 changes its class, not its identity).

    Args:
        model: The Module, possibly (partly) on the meta device.
        mesh: 1-D mesh (FSDP) or 2-D ``(replicate, shard)`` mesh (HSDP).
        wrap_policy: Which submodules become their own sharding unit.
        activation_checkpointing: Which submodules recompute activations.
        init_device: Where meta tensors are allocated (CPU when offloading).
        fully_shard_kwargs: ``reshard_after_forward``, ``mp_policy``, ``offload_policy``, ...

    Raises:
        MisconfigurationError: A policy's class does not occur in the model, or a meta module cannot
            be initialised.
    """
    for option, policy in (
        ("auto_wrap_policy", wrap_policy),
        ("activation_checkpointing_policy", activation_checkpointing),
    ):
        if isinstance(policy, ModuleClassPolicy):
            policy.check_occurs_in(model, option=option)
    to_init = modules_needing_init(model) if has_meta_tensors(model) else []
    apply_activation_checkpointing(model, activation_checkpointing)
    for module in matching_modules(model, wrap_policy):
        fully_shard(module, mesh=mesh, **fully_shard_kwargs)
    fully_shard(model, mesh=mesh, **fully_shard_kwargs)
    if to_init:
        materialize_meta(model, to_init, init_device)
    return model
