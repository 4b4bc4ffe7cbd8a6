"""What one rank of a (replicate x shard) data x context x tensor x pipeline mesh holds.

Pipeline parallel gives each rank 1/pp of the layers, tensor parallel splits each of its layers
over tp ranks, and FSDP2 shards what is left over the data-shard x context-parallel ranks
(``strategy.fsdp_mesh``; replicate ranks of HSDP hold copies); gradients and optimizer state
follow the weights. How much a tensor-parallel plan really splits is written in the user's
``configure_model``, which the estimate cannot read from shapes: it assumes every layer is split
(the usual plan for transformer blocks) and says so in its notes. The FSDP-gathered unit is one
block's tensor-parallel slice (``other``); activations are divided by tp x cp (context parallel
splits the sequence; the gathered K/V of one attention call, which grows with the whole length,
is not counted) and follow ``activation_checkpointing_policy``
(:func:`phalanx.memory.activation_estimate`).

Expert parallel: stacked expert weights (parameters under a module named ``experts`` whose first
dim is the expert count, the layout ``ExpertParallel`` shards) are counted per rank as
``E / expert_parallel_size`` experts in the layout line, and are not divided by tp (they are
replicated over tensor-parallel ranks); their bytes per rank equal FSDP's over the same data-shard
ranks, since ``expert_parallel`` ranks are data-parallel ranks.
"""

from __future__ import annotations

from typing import Any

from phalanx.memory import (
    MemoryEstimate,
    MemoryRequest,
    activation_estimate,
    gathered_bytes,
    optimizer_state_bytes,
    optimizer_step_bytes,
    shard,
)

__all__ = ["TARGET", "estimate", "expert_layers", "mesh_sizes"]

TARGET = "phalanx_strategy_model_parallel.strategy:ModelParallelStrategy"


def mesh_sizes(params: Any, *, devices: int, num_nodes: int) -> tuple[int, int, int]:
    """(dp, tp, pp) as the strategy resolves "auto": tp the devices of a node / (pp x cp), dp the rest."""
    world = devices * num_nodes
    pp = int(params.get("pipeline_parallel_size", 1))
    cp = int(params.get("context_parallel_size", 1) or 1)
    dp, tp = params.get("data_parallel_size", "auto"), params.get("tensor_parallel_size", "auto")
    if dp == "auto" and tp == "auto":
        tp = max(1, devices // (pp * cp))
        dp = max(1, world // (tp * pp * cp))
    elif dp == "auto":
        dp = max(1, world // (int(tp) * pp * cp))
    elif tp == "auto":
        tp = max(1, world // (int(dp) * pp * cp))
    return int(dp), int(tp), pp


def expert_layers(params: Any) -> dict[str, int]:
    """Stacked-experts modules of a model by name, with their expert counts (the first dim)."""
    found: dict[str, int] = {}
    for param in params:
        parts = param.name.split(".")
        if "experts" in parts[:-1] and len(param.shape) >= 2:
            at = parts.index("experts")
            if not parts[at + 1].isdigit():  # an nn.ModuleList of experts is not the stacked layout
                found[".".join(parts[: at + 1])] = param.shape[0]
    return found


def estimate(request: MemoryRequest) -> MemoryEstimate | None:
    """Weights, gradients and optimizer state divided over the sharding ranks; one block slice gathered."""
    if request.target != TARGET:
        return None
    params = request.init_params
    dp, tp, pp = mesh_sizes(params, devices=request.devices, num_nodes=request.num_nodes)
    cp = int(params.get("context_parallel_size", 1) or 1)
    replicate = int(params.get("data_parallel_replicate_size", 1) or 1)
    size = request.bytes
    ep = int(params.get("expert_parallel_size", 1) or 1)
    ranks = (dp // max(1, replicate)) * cp * tp * pp  # ranks holding distinct slices of the weights
    experts = expert_layers(request.model.parameters) if ep > 1 else {}
    expert_names = tuple(f"{name}." for name in experts)
    # Expert weights are sharded over the data-shard (x cp x pp) ranks, not over tp.
    per_param = [
        (p, shard(p.numel, ranks // tp if p.name.startswith(expert_names) and expert_names else ranks))
        for p in request.model.parameters
    ]
    local = sum(n for _, n in per_param)
    trainable = sum(n for p, n in per_param if p.requires_grad)
    notes = ["assumes configure_model splits every layer over tp", "transient: one block slice gathered by FSDP"]
    shards = [n for p, n in per_param if p.requires_grad]
    if ep > 1:
        shard_ranks = dp // max(1, replicate)
        if shard_ranks % ep:
            notes.insert(
                0, f"expert_parallel_size={ep} does not divide {shard_ranks} data-shard ranks: the run would refuse it"
            )
        counts = sorted(set(experts.values()))
        if counts:
            notes.append(
                f"experts: {len(experts)} MoE layer(s) of {'/'.join(map(str, counts))} experts, "
                f"{'/'.join(str(c // ep) for c in counts)} per rank over ep={ep} (not split by tp)"
            )
        else:
            notes.append(f"expert_parallel_size={ep}, but no stacked 'experts' module found: estimated as dense")
    if dp * cp * tp * pp != request.world_size:
        notes.insert(0, f"mesh {dp}x{cp}x{tp}x{pp} != world size {request.world_size}: the run would refuse it")
    if cp > 1:
        notes.append(f"activations / (tp x cp = {tp * cp}), but attention's saved tensors cover the whole sequence")
    layout = f"dp={dp} x tp={tp} x pp={pp}"
    if replicate > 1:
        layout = f"dp={dp} (replicate {replicate} x shard {dp // replicate}) x tp={tp} x pp={pp}"
    if cp > 1:
        layout += f" x cp={cp}"
    if ep > 1:
        per_rank = "/".join(str(c // ep) for c in sorted(set(experts.values())))
        layout += f", ep={ep} (of dp)" + (f": {per_rank} experts per rank" if per_rank else "")
    return MemoryEstimate(
        parameters=local * size.weights,
        gradients=trainable * size.gradients,
        optimizer_states=optimizer_state_bytes(request.optimizer, trainable, state_dtype_bytes=size.weights),
        activations=activation_estimate(request, divisor=tp * cp, context_parallel=cp),
        other=request.model.buffer_bytes,
        transient=gathered_bytes(request, shard(request.model.largest_block, tp))
        + shard(request.model.largest_block, tp) * size.gradients,
        step=optimizer_step_bytes(
            request.optimizer, shards, device_type=request.device_type, state_dtype_bytes=size.weights
        ),
        layout=layout,
        notes=tuple(notes),
    )
