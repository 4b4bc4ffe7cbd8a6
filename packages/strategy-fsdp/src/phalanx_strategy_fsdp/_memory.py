"""What one FSDP2 rank holds: a shard of weights, gradients and optimizer state, plus one gathered unit.

``fully_shard`` splits every parameter along dim 0 (padding it to a multiple of the shard count),
and gradients and optimizer state follow the parameter's sharding. During forward and backward
one sharding unit at a time is all-gathered in the compute dtype (float8 for the Linear weights
under ``precision="float8"``), and its gradients exist
unsharded until the reduce-scatter: that working set is ``transient`` (freed before the optimizer
step, whose temporaries are per local shard). Without an
``auto_wrap_policy`` the whole model is one unit; with ``reshard_after_forward=False`` every unit
stays gathered from forward to backward. CPU offload keeps the shards in host memory.
"""

from __future__ import annotations

import math

from phalanx.memory import (
    MemoryEstimate,
    MemoryRequest,
    activation_estimate,
    gathered_bytes,
    optimizer_state_bytes,
    optimizer_step_bytes,
)

__all__ = ["TARGET", "estimate"]

TARGET = "phalanx_strategy_fsdp.strategy:FSDPStrategy"


def _shard_count(request: MemoryRequest) -> tuple[int, str]:
    mesh = request.init_params.get("device_mesh")
    if mesh == "hybrid":
        return request.devices, f"replicate x{request.num_nodes}, shard x{request.devices}"
    if isinstance(mesh, (tuple, list)) and len(mesh) == 2:
        return int(mesh[1]), f"replicate x{mesh[0]}, shard x{mesh[1]}"
    return request.world_size, f"sharded x{request.world_size}"


def estimate(request: MemoryRequest) -> MemoryEstimate | None:
    """Shards of weights, gradients and optimizer state; the gathered unit as ``transient``."""
    if request.target != TARGET:
        return None
    ranks, layout = _shard_count(request)
    size, params = request.bytes, request.model.parameters

    def one(shape: tuple[int, ...]) -> int:
        return math.ceil(shape[0] / ranks) * math.prod(shape[1:]) if shape else 1

    weights = sum(one(p.shape) for p in params) * size.weights
    shards = [one(p.shape) for p in params if p.requires_grad]
    trainable = sum(shards)
    step = optimizer_step_bytes(request.optimizer, shards, device_type=request.device_type, state_dtype_bytes=size.weights)
    gradients = trainable * size.gradients
    states = optimizer_state_bytes(request.optimizer, trainable, state_dtype_bytes=size.weights)
    wrapped = request.init_params.get("auto_wrap_policy") is not None
    keep_gathered = request.init_params.get("reshard_after_forward", True) is False
    unit = request.model.largest_block if wrapped and not keep_gathered else request.model.numel
    working = gathered_bytes(request, unit) + unit * size.gradients  # in param_dtype (float8 Linear weights)
    notes = [f"transient: {'largest wrapped unit' if unit != request.model.numel else 'whole model (one unit)'} gathered"]
    if request.init_params.get("cpu_offload"):
        notes.append("shards of weights, gradients and optimizer state in CPU memory")
        return MemoryEstimate(
            parameters=0,
            gradients=0,
            optimizer_states=0,
            activations=activation_estimate(request),
            other=request.model.buffer_bytes,
            transient=working,
            cpu=weights + gradients + states,
            layout=layout + ", CPU offload",
            notes=tuple(notes),
        )
    return MemoryEstimate(
        parameters=weights,
        gradients=gradients,
        optimizer_states=states,
        activations=activation_estimate(request),
        other=request.model.buffer_bytes,
        transient=working,
        step=step,
        layout=layout,
        notes=tuple(notes),
    )
