"""The memory sweep's model and the planner's estimate for it (see bench_memory_sweep.py).

Shared by the sweep's driver and its rank processes: the model is built the same way for the run
and, on the meta device, for the estimate, with the same strategy parameters.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BATCH", "estimate", "overrides", "params_of", "stack"]

BATCH = 4  # rows per rank: activations stay negligible next to the model states


def stack(layers: int, width: int) -> Any:
    """The measured model: ``layers`` x (Linear(width, width), ReLU)."""
    from torch import nn

    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks)


def params_of(layers: int, width: int) -> int:
    return layers * (width * width + width)


def overrides(name: str, width: int, ranks: int) -> dict[str, Any]:
    """Strategy parameters beyond the registered ones (see the module docstring), for run and estimate."""
    if name == "ddp":
        return {"gradient_as_bucket_view": True}
    if name == "fsdp":
        from torch import nn

        return {"auto_wrap_policy": {nn.Linear}}
    if name.startswith("deepspeed_stage_"):
        layer = width * width
        tuned = {"reduce_bucket_size": layer, "allgather_bucket_size": layer}
        if name.endswith("3"):
            tuned |= {
                "stage3_prefetch_bucket_size": layer,
                "stage3_max_live_parameters": 2 * layer,
                "stage3_max_reuse_distance": layer,
            }
        return tuned
    if name == "model_parallel":
        return {"data_parallel_size": ranks // 2, "tensor_parallel_size": 2}
    return {}


def estimate(name: str, layers: int, width: int, ranks: int) -> dict[str, int]:
    """The installed plugins' estimate of one rank, as ``phalanx plan`` computes it."""
    from phalanx.memory import MemoryRequest
    from phalanx.model_shapes import build_on_meta, summarize_model
    from phalanx.planning import estimate_memory
    from phalanx.registry import StrategyRegistry

    entry = StrategyRegistry.entry(name)
    summary = summarize_model(build_on_meta(lambda: stack(layers, width)), input_shape=(BATCH, width))
    params = {**entry.init_params, **overrides(name, width, ranks)}
    found = estimate_memory(MemoryRequest(name, entry.target_path, params, summary, devices=ranks))
    if found is None:
        msg = f"no installed plugin estimates {name!r}"
        raise SystemExit(msg)
    return {
        k: v or 0
        for k, v in found.as_dict().items()
        if k in ("parameters", "gradients", "optimizer_states", "activations", "other", "total")
    }
