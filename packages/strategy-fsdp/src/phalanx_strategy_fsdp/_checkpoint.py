"""Full FSDP checkpoints, and sharded ones through the core's DCP format.

A *sharded* checkpoint is the core's DCP directory (:mod:`phalanx.checkpoint_io.dcp`): one shard
file per rank, written in parallel, loadable on another number of ranks; this module adds
nothing to it. A *full* checkpoint is one ordinary phalanx file written by rank 0, with the
unsharded weights and position-keyed optimizer state, loadable by any strategy.

Every function here is collective: all ranks must call it together.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from phalanx.checkpoint_io import dcp
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.checkpoint_io.checks import check_optimizer_count
from phalanx_strategy_fsdp._state import full_to_plain, optimizer_fqns, to_fqn_keys, to_index_keys

__all__ = ["MODEL_KEY", "OPTIMIZER_KEY", "holds_shards", "load_full_model", "load_full_optimizers", "save_full"]

MODEL_KEY = dcp.MODEL_KEY
OPTIMIZER_KEY = dcp.OPTIMIZER_KEY
#: Trainer keys that cannot be stored as they are: mid-accumulation gradients live inside FSDP's
#: unsharded buffers, not in ``param.grad``, so the Trainer's copy would be wrong (see docs/fsdp.md).
_DROPPED = ("accumulated_grads",)
#: Full (unsharded) state dicts, gathered to CPU: what a full checkpoint file holds.
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def save_full(
    checkpoint: dict[str, Any],
    path: PathLike,
    *,
    model: nn.Module,
    optimizers: list[Optimizer],
    checkpoint_io: CheckpointIO,
    is_global_zero: bool,
    barrier: Callable[[], None],
) -> None:
    """Gather everything to rank 0 (on CPU, one tensor at a time) and write one ordinary file."""
    state_dict = full_to_plain(get_model_state_dict(model, options=FULL))
    optimizer_states = [
        full_to_plain(get_optimizer_state_dict(model, optimizer, options=FULL)) for optimizer in optimizers
    ]
    if is_global_zero:
        positional = [
            to_index_keys(state, optimizer_fqns(model, opt)) for state, opt in zip(optimizer_states, optimizers)
        ]
        full = {key: value for key, value in checkpoint.items() if key not in _DROPPED}
        full[MODEL_KEY] = state_dict
        if optimizers:
            full[OPTIMIZER_KEY] = positional
        if os.path.isdir(path):
            shutil.rmtree(path)
        checkpoint_io.save_checkpoint(full, path)
    barrier()


def load_full_model(model: nn.Module, state_dict: dict[str, Any], *, source: str, strict: bool = True) -> None:
    """Shard a full state dict (every rank holds it) into the model.

    Raises:
        CheckpointError: The state dict belongs to another model.
    """
    shapes = {name: tuple(v.shape) if hasattr(v, "shape") else None for name, v in state_dict.items()}
    dcp.check_model_matches(model, shapes, source=source, strict=strict)
    set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True, strict=strict))


def load_full_optimizers(
    model: nn.Module, optimizers: list[Optimizer], states: list[dict[str, Any]], *, source: str
) -> None:
    """Load position- or name-keyed full optimizer states (from fsdp "full", ddp or single_device files).

    Raises:
        CheckpointError: A different number of optimizers.
    """
    check_optimizer_count(len(states), len(optimizers), source=source)
    for optimizer, state in zip(optimizers, states):
        if not state.get("state"):
            dcp.load_optimizer_hyperparameters(optimizer, state)
            continue
        named = to_fqn_keys(state, optimizer_fqns(model, optimizer))
        set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))


def holds_shards(state: Any) -> bool:
    """Whether a (nested) state dict holds DTensor shards, i.e. came from a sharded read."""
    if isinstance(state, DTensor):
        return True
    if isinstance(state, dict):
        return any(holds_shards(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return any(holds_shards(value) for value in state)
    return False
