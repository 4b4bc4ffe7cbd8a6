"""What one DeepSpeed ZeRO rank holds, stage by stage, and what offloading moves to CPU or NVMe.

With Φ trainable elements, N ranks and c bytes per compute element (2 under 16/bf16 precisions,
where the engine casts the module, else 4), the optimizer always steps a float32 master copy of
its partition (4Φ/N) with its state (8Φ/N for Adam):

- stage 0/1: module weights and gradients whole (cΦ each); stage 0 keeps whole masters too.
- stage 2: weights whole; gradients as a c-typed partition plus the float32 partition gradient
  the step reads (cΦ/N + 4Φ/N); ``transient`` counts the reduce buckets of backward
  (``reduce_bucket_size`` elements, twice with ``overlap_comm``) and the module gradients waiting
  for a bucket's reduction (up to one bucket's worth: measured, the whole model's under a bucket
  larger than it).
- stage 3: weights partitioned (cΦ/N) and float32 partition gradients (4Φ/N); ``other`` is the
  persistent reduce bucket, ``transient`` the largest block gathered at a time with its
  gradients before their reduce-scatter.

The optimizer steps the flat float32 partition (one tensor per parameter group) from stage 1
on, the module's own parameters at stage 0: its temporaries are ``step``; at stage 3 ``step`` also
holds the float32 gradient the engine flattens out of its gradient partition for the step.

``offload_optimizer`` moves masters, their gradients and state to CPU (or NVMe);
``offload_parameters`` moves the stage-3 weight partitions too.
"""

from __future__ import annotations

from typing import Any

from phalanx.memory import (
    MemoryEstimate,
    MemoryRequest,
    activation_estimate,
    optimizer_state_bytes,
    optimizer_step_bytes,
    shard,
)
from phalanx_strategy_deepspeed._config import TUNING_DEFAULTS

__all__ = ["TARGET", "estimate"]

TARGET = "phalanx_strategy_deepspeed.strategy:DeepSpeedStrategy"


def _stage(params: Any) -> int:
    config = params.get("config")
    if isinstance(config, dict) and isinstance(config.get("zero_optimization"), dict):
        return int(config["zero_optimization"].get("stage", 0))
    return int(params.get("stage", 2))


def estimate(request: MemoryRequest) -> MemoryEstimate | None:
    """Per-rank device bytes for the request's ZeRO stage and offload settings."""
    if request.target != TARGET:
        return None
    params, ranks, numel = request.init_params, request.world_size, request.model.trainable_numel
    stage = _stage(params)
    size = request.bytes
    compute = 2 if size.mixed or size.weights == 2 else 4
    part = shard(numel, ranks)
    adam = optimizer_state_bytes(request.optimizer, part)
    masters = 4 * (numel if stage == 0 else part)
    states = masters + (adam if stage else optimizer_state_bytes(request.optimizer, numel))
    bucket = int(params.get("reduce_bucket_size", TUNING_DEFAULTS["reduce_bucket_size"])) * compute
    stepped = [p.numel for p in request.model.parameters if p.requires_grad] if stage == 0 else [part]
    step = optimizer_step_bytes(request.optimizer, stepped, device_type=request.device_type)
    notes: list[str] = []
    other = transient = 0
    if stage <= 1:
        weights, gradients = compute * request.model.numel, compute * numel + 4 * part
    elif stage == 2:
        weights, gradients = compute * request.model.numel, (compute + 4) * part
        overlap = bool(params.get("overlap_comm", TUNING_DEFAULTS["overlap_comm"]))
        elements = int(params.get("reduce_bucket_size", TUNING_DEFAULTS["reduce_bucket_size"]))
        transient = bucket * (2 if overlap else 1) + compute * min(numel, elements)
        notes.append(
            f"transient: {'2 reduce buckets' if overlap else 'reduce bucket'} and the gradients waiting for one"
        )
    else:
        weights, gradients = compute * shard(request.model.numel, ranks), 4 * part
        other, transient = bucket, (compute + 4) * request.model.largest_block
        # The step flattens the float32 gradient partition into a new tensor for the optimizer
        # (stage 3's _prepare_fp32_grad_for_sub_group), beside the partition it keeps: measured, the
        # step peaks at three partitions above the steady bytes (AdamW's two temporaries and it).
        step += 4 * part
        notes.append(
            "other: the reduce bucket; transient: the largest gathered block and its gradients; "
            "step: the optimizer's temporaries and the flattened float32 gradient copy"
        )
    cpu = nvme = 0
    if params.get("offload_optimizer"):
        moved = states + 4 * part
        states, gradients, step = 0, gradients - 4 * part, 0  # the step runs on the host
        if params.get("offload_optimizer_device", "cpu") == "nvme":
            nvme += moved
        else:
            cpu += moved
        notes.append("optimizer masters and state offloaded")
    if stage == 3 and params.get("offload_parameters"):
        if params.get("offload_params_device", "cpu") == "nvme":
            nvme += weights
        else:
            cpu += weights
        weights = 0
        notes.append("parameter partitions offloaded")
    layout = f"ZeRO-{stage} x{ranks}" + (", offload" if cpu or nvme else "")
    return MemoryEstimate(
        parameters=weights,
        gradients=gradients,
        optimizer_states=states,
        activations=activation_estimate(request),
        other=other + request.model.buffer_bytes,
        transient=transient,
        step=step,
        cpu=cpu,
        nvme=nvme,
        layout=layout,
        notes=tuple(notes),
    )
