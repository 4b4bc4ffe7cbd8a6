"""One consolidated checkpoint file: the full model and optimizer state, written by rank 0.

For ``save_distributed_checkpoint=False``. Each DTensor is gathered to full size (collective over
its mesh), pipeline stages are collected from the ranks that hold them, and rank 0 writes an
ordinary phalanx file (``"state_dict"`` full fp tensors by name; optimizer states keyed by
parameter name), which ``single_device`` / ``ddp`` can load for weights and this strategy can
load on any mesh. Loading one distributes each full tensor into this run's shards.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.checkpoint_io.checks import check_optimizer_count
from phalanx.errors import CheckpointError

__all__ = ["load_full_model", "load_full_optimizers", "save_consolidated"]

_FULL = StateDictOptions(full_state_dict=True)


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cpu(v) for v in value]
    return value


def _merge_optimizer(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {"state": {}, "param_groups": []}
    for part in parts:
        merged["state"].update(part.get("state", {}))
        for index, group in enumerate(part.get("param_groups", [])):
            if index == len(merged["param_groups"]):
                merged["param_groups"].append({**group, "params": list(group["params"])})
            else:
                merged["param_groups"][index]["params"].extend(
                    p for p in group["params"] if p not in merged["param_groups"][index]["params"]
                )
    return merged


def save_consolidated(
    checkpoint: dict[str, Any],
    path: PathLike,
    *,
    model: nn.Module,
    optimizers: list[Optimizer],
    checkpoint_io: CheckpointIO,
    is_global_zero: bool,
    contributes: bool,
    barrier: Callable[[], None],
) -> None:
    """Gather full states; ranks that hold a distinct pipeline stage (``contributes``) send them to rank 0."""
    model_state = _cpu(get_model_state_dict(model, options=_FULL))
    optimizer_states = [_cpu(get_optimizer_state_dict(model, opt, options=_FULL)) for opt in optimizers]
    payload = (model_state, optimizer_states) if contributes else None
    gathered: list[Any] = [None] * dist.get_world_size() if is_global_zero else []
    dist.gather_object(payload, gathered if is_global_zero else None, dst=0)
    if is_global_zero:
        parts = [p for p in gathered if p is not None]
        full_model: dict[str, Any] = {}
        for state, _ in parts:
            full_model.update(state)
        full_optimizers = [_merge_optimizer([opts[i] for _, opts in parts]) for i in range(len(optimizers))]
        full = {k: v for k, v in checkpoint.items() if k != "accumulated_grads"}
        full["state_dict"] = full_model
        if optimizers:
            full["optimizer_states"] = full_optimizers
        if os.path.isdir(os.fspath(path)):
            shutil.rmtree(os.fspath(path))
        checkpoint_io.save_checkpoint(full, path)
    barrier()


def load_full_model(model: nn.Module, state_dict: Mapping[str, Any], *, strict: bool, partial: bool) -> None:
    """Distribute a full state dict (every rank holds it) into this rank's shards."""
    local = set(get_model_state_dict(model))
    chosen = {k: v for k, v in state_dict.items() if k in local} if partial else dict(state_dict)
    set_model_state_dict(model, chosen, options=StateDictOptions(full_state_dict=True, strict=strict and not partial))


def load_full_optimizers(model: nn.Module, optimizers: list[Optimizer], states: list[Any], *, source: str) -> None:
    """Load name-keyed full optimizer states into this rank's sharded optimizers.

    Raises:
        CheckpointError: A different number of optimizers, or position-keyed states (from another
            strategy's file), which cannot be matched to this rank's parameters.
    """
    check_optimizer_count(len(states), len(optimizers), source=source)
    local = set(get_model_state_dict(model))
    for optimizer, state in zip(optimizers, states):
        groups = state.get("param_groups", [])
        if any(not isinstance(p, str) for g in groups for p in g.get("params", [])):
            msg = (
                f"The optimizer state in {source!r} is keyed by position (written by another strategy), so it cannot "
                "be matched to this mesh's parameters. Fix: load its weights only (fit without ckpt_path after "
                "loading state_dict), or resume from a ModelParallelStrategy checkpoint."
            )
            raise CheckpointError(msg)
        mine = {
            "state": {k: v for k, v in state.get("state", {}).items() if k in local},
            "param_groups": [{**g, "params": [p for p in g["params"] if p in local]} for g in groups],
        }
        set_optimizer_state_dict(model, optimizer, mine, options=StateDictOptions(full_state_dict=True))
