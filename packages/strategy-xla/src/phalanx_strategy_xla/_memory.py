"""What one XLA device holds: a replica (single_xla, xla) or an FSDP-style shard (xla_fsdp).

``xla`` runs one process per device and all-reduces gradients in place (``xm.reduce_gradients``),
so each device keeps a full replica with no extra bucket. ``xla_fsdp`` is SPMD in one process:
parameters, gradients and optimizer state are sharded along dim 0 over every device of the mesh,
and XLA gathers one layer at a time (counted as ``other``). XLA's compiler can fuse or rematerialise
buffers, so these are upper bounds of the tensors the program holds rather than exact numbers.
"""

from __future__ import annotations

import math

from phalanx.memory import (
    MemoryEstimate,
    MemoryRequest,
    activation_estimate,
    optimizer_state_bytes,
    replicated_estimate,
)

__all__ = ["TARGETS", "estimate"]

_PKG = "phalanx_strategy_xla"
TARGETS = {
    f"{_PKG}.single_device:SingleDeviceXLAStrategy": "replica",
    f"{_PKG}.strategy:XLAStrategy": "replica",
    f"{_PKG}.spmd:XLAFSDPStrategy": "sharded",
}


def estimate(request: MemoryRequest) -> MemoryEstimate | None:
    """Replica or SPMD shard per device, depending on which of this plugin's classes is asked."""
    kind = TARGETS.get(request.target)
    if kind is None:
        return None
    notes = ("XLA may fuse buffers: an upper bound",)
    if kind == "replica":
        return replicated_estimate(request, layout=f"replicated x{request.world_size}", notes=notes)
    ranks, size = request.world_size, request.bytes
    local = sum(math.ceil(p.shape[0] / ranks) * math.prod(p.shape[1:]) if p.shape else 1 for p in request.model.parameters)
    trainable = sum(
        math.ceil(p.shape[0] / ranks) * math.prod(p.shape[1:]) if p.shape else 1
        for p in request.model.parameters
        if p.requires_grad
    )
    return MemoryEstimate(
        parameters=local * size.weights,
        gradients=trainable * size.gradients,
        optimizer_states=optimizer_state_bytes(request.optimizer, trainable, state_dtype_bytes=size.weights),
        activations=activation_estimate(request),
        other=request.model.buffer_bytes + request.model.largest_block * size.weights,
        layout=f"SPMD sharded x{ranks}",
        notes=(*notes, "other: largest layer gathered"),
    )
