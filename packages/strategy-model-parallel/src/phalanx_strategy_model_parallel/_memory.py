"""What one rank of a data x tensor x pipeline mesh holds.

Pipeline parallel gives each rank 1/pp of the layers, tensor parallel splits each of its layers
over tp ranks, and FSDP2 shards what is left over dp ranks; gradients and optimizer state follow
the weights. How much a tensor-parallel plan really splits is written in the user's
``configure_model``, which the estimate cannot read from shapes: it assumes every layer is split
(the usual plan for transformer blocks) and says so in its notes. The FSDP-gathered unit is one
block's tensor-parallel slice (``other``); activations are divided by tp.
"""

from __future__ import annotations

from typing import Any

from phalanx.memory import MemoryEstimate, MemoryRequest, activation_estimate, optimizer_state_bytes, shard

__all__ = ["TARGET", "estimate", "mesh_sizes"]

TARGET = "phalanx_strategy_model_parallel.strategy:ModelParallelStrategy"


def mesh_sizes(params: Any, *, devices: int, num_nodes: int) -> tuple[int, int, int]:
    """(dp, tp, pp) as the strategy resolves "auto": tp the devices of a node / pp, dp the nodes."""
    world = devices * num_nodes
    pp = int(params.get("pipeline_parallel_size", 1))
    dp, tp = params.get("data_parallel_size", "auto"), params.get("tensor_parallel_size", "auto")
    if dp == "auto" and tp == "auto":
        tp, dp = max(1, devices // pp), num_nodes
    elif dp == "auto":
        dp = max(1, world // (int(tp) * pp))
    elif tp == "auto":
        tp = max(1, world // (int(dp) * pp))
    return int(dp), int(tp), pp


def estimate(request: MemoryRequest) -> MemoryEstimate | None:
    """Weights, gradients and optimizer state divided over the whole mesh; one block slice gathered."""
    if request.target != TARGET:
        return None
    dp, tp, pp = mesh_sizes(request.init_params, devices=request.devices, num_nodes=request.num_nodes)
    size = request.bytes
    ranks = dp * tp * pp
    local = shard(request.model.numel, ranks)
    trainable = shard(request.model.trainable_numel, ranks)
    compute = size.activations if size.mixed else size.weights
    notes = ["assumes configure_model splits every layer over tp", "other: one block slice gathered by FSDP"]
    if ranks != request.world_size:
        notes.insert(0, f"mesh {dp}x{tp}x{pp} != world size {request.world_size}: the run would refuse it")
    return MemoryEstimate(
        parameters=local * size.weights,
        gradients=trainable * size.gradients,
        optimizer_states=optimizer_state_bytes(request.optimizer, trainable, state_dtype_bytes=size.weights),
        activations=activation_estimate(request, divisor=tp),
        other=request.model.buffer_bytes + shard(request.model.largest_block, tp) * (compute + size.gradients),
        layout=f"dp={dp} x tp={tp} x pp={pp}",
        notes=tuple(notes),
    )
