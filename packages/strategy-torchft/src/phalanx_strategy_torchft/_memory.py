"""What one rank holds: ``ft_ddp`` a full replica plus DDP's gradient buckets (as in ddp);
``ft_hsdp`` the FSDP2 shards of its group plus the flat gradient buffer, and one gathered unit in
forward and backward (``transient``); the optimizer's temporaries are per local shard (``step``).

``ft_diloco`` holds ft_ddp's replica (without DDP's buckets in a group of one rank) plus the global weights of the last sync (torchft keeps them
in host memory, ``cpu``), the outer optimizer's state (Nesterov SGD: one momentum per weight, on
the device) and, during a sync, the pseudo-gradient of the fragment being synchronised (``step``).

torchft adds a copy of the state only while a peer heals from this rank (the state it serves),
which is transient and not counted. A request's world is one replica group (the Trainer's world).
"""

from __future__ import annotations

import math
from dataclasses import replace

from phalanx.memory import (
    MemoryEstimate,
    MemoryRequest,
    activation_estimate,
    optimizer_state_bytes,
    optimizer_step_bytes,
    replicated_estimate,
)

__all__ = ["estimate"]

_TARGET = "phalanx_strategy_torchft.strategy:FTDDPStrategy"
_HSDP_TARGET = "phalanx_strategy_torchft.hsdp:FTHSDPStrategy"
_DILOCO_TARGET = "phalanx_strategy_torchft.diloco:FTDiLoCoStrategy"


def estimate(request: MemoryRequest) -> MemoryEstimate | None:
    """A replica per rank and a second copy of the gradients in DDP's buckets (``ft_ddp``), or the
    group's shards (``ft_hsdp``)."""
    if request.target == _HSDP_TARGET:
        return _sharded(request)
    if request.target == _DILOCO_TARGET:
        return _diloco(request)
    if request.target != _TARGET:
        return None
    buckets = request.model.trainable_numel * request.bytes.gradients
    return replicated_estimate(
        request,
        layout=f"replicated x{request.world_size} (replica groups x ranks per group)",
        other=buckets,
        notes=("other: DDP gradient buckets (a 2nd copy)",),
    )


def _sharded(request: MemoryRequest) -> MemoryEstimate:
    """FSDP2 splits dim 0 over the group's ranks; gradients and optimizer state follow the shards."""
    ranks, size, params = request.world_size, request.bytes, request.model.parameters

    def one(shape: tuple[int, ...]) -> int:
        return math.ceil(shape[0] / ranks) * math.prod(shape[1:]) if shape else 1

    weights = sum(one(p.shape) for p in params)
    shards = [one(p.shape) for p in params if p.requires_grad]
    trainable = sum(shards)
    wrapped = bool(request.init_params.get("auto_wrap_policy"))
    unit = request.model.largest_block if wrapped else request.model.numel
    gathered = unit * (size.weights + size.gradients)
    flat = trainable * size.gradients  # the shards copied into one buffer for torchft's all-reduce
    return MemoryEstimate(
        parameters=weights * size.weights,
        gradients=trainable * size.gradients,
        optimizer_states=optimizer_state_bytes(request.optimizer, trainable, state_dtype_bytes=size.weights),
        activations=activation_estimate(request),
        other=request.model.buffer_bytes + flat,
        transient=gathered,
        step=optimizer_step_bytes(
            request.optimizer, shards, device_type=request.device_type, state_dtype_bytes=size.weights
        ),
        layout=f"sharded x{ranks} in each replica group, replicated across groups",
        notes=(
            f"transient: {'largest wrapped unit' if wrapped else 'whole model (one unit)'} gathered; "
            "other: the flat gradient shard torchft all-reduces",
        ),
    )


def _diloco(request: MemoryRequest) -> MemoryEstimate:
    """ft_ddp's replica, plus the global weights (host memory), the outer momentum and a fragment's
    pseudo-gradient during a sync (the default outer optimizer; another one's state is not modelled)."""
    trainable = request.model.trainable_numel * request.bytes.weights
    fragments = request.init_params.get("num_fragments", 1)
    fragments = fragments if isinstance(fragments, int) and fragments > 0 else 1
    base = replicated_estimate(
        request,
        layout=f"replicated x{request.world_size} (replica groups x ranks per group)",
        other=request.model.trainable_numel * request.bytes.gradients if request.world_size > 1 else 0,
        notes=(
            "other: DDP gradient buckets (a 2nd copy; none in a group of one rank, which runs the Module bare); "
            "optimizer_states: inner optimizer + outer Nesterov momentum; "
            "cpu: the global weights of the last sync; step: one fragment's pseudo-gradient",
        ),
    )
    return replace(
        base,
        optimizer_states=base.optimizer_states + trainable,
        cpu=trainable,
        step=max(base.step, math.ceil(trainable / fragments)),
    )
