"""Which kind of state an FSDP checkpoint holds when it is loaded.

A *sharded* checkpoint is the core's DCP directory (:mod:`phalanx.checkpoint_io.dcp`): one shard
file per rank, loadable on another number of ranks. A *full* checkpoint is one ordinary phalanx
file written by rank 0 (:mod:`phalanx.checkpoint_io.full_state`), with the unsharded weights and
position-keyed optimizer state, loadable by any strategy. This package adds nothing to either
format; it only tells them apart.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import DTensor

from phalanx.checkpoint_io import dcp

__all__ = ["MODEL_KEY", "OPTIMIZER_KEY", "holds_shards"]

MODEL_KEY = dcp.MODEL_KEY
OPTIMIZER_KEY = dcp.OPTIMIZER_KEY


def holds_shards(state: Any) -> bool:
    """Whether a (nested) state dict holds DTensor shards, i.e. came from a sharded read."""
    if isinstance(state, DTensor):
        return True
    if isinstance(state, dict):
        return any(holds_shards(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return any(holds_shards(value) for value in state)
    return False
