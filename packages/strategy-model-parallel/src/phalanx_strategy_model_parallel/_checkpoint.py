"""Distributed checkpoints (DCP directories) of a model spread over a dp x tp x pp mesh.

Every rank writes the shards it holds (``torch.distributed.checkpoint``), keyed by the full
model's parameter names; DCP records each tensor's global shape and every shard's offsets, so a
checkpoint written on one mesh shape loads on another: each rank reads just the slices its own
shards cover (2 x 2 -> 4 x 1 -> 1 x 2). Pipeline ranks hold disjoint names, so a pipeline
checkpoint is the union of the stages. Rank 0 writes the Trainer's state (loops, callbacks,
schedulers, precision) as ``trainer_state.pt`` last; its presence marks a complete save.

Every function here is collective: all ranks must call it together.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.optim import Optimizer

from phalanx.checkpoint_io.atomic import prepare_staging, publish_directory, staging_directory
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.errors import CheckpointError

__all__ = [
    "FORMAT",
    "META_FILE",
    "MODEL_KEY",
    "OPTIMIZER_KEY",
    "is_distributed_checkpoint",
    "read_distributed",
    "read_meta",
    "save_distributed",
]

META_FILE = "trainer_state.pt"
MODEL_KEY = "state_dict"
OPTIMIZER_KEY = "optimizer_states"
FORMAT = "phalanx-model-parallel-dcp"
#: Mid-accumulation gradients are per-shard DTensors the Trainer's plain copy cannot hold.
_DROPPED = ("accumulated_grads",)


def is_distributed_checkpoint(path: PathLike) -> bool:
    """Whether ``path`` is a DCP directory written by this strategy."""
    path = os.fspath(path)
    return os.path.isfile(os.path.join(path, ".metadata")) and os.path.isfile(os.path.join(path, META_FILE))


def read_meta(path: PathLike, checkpoint_io: CheckpointIO) -> dict[str, Any]:
    """The Trainer state stored beside the shards.

    Raises:
        CheckpointError: No ``trainer_state.pt`` (an interrupted save) or not this format.
    """
    meta_path = os.path.join(os.fspath(path), META_FILE)
    if not os.path.isfile(meta_path):
        msg = (
            f"{os.fspath(path)!r} has no {META_FILE}: the save was interrupted, or it was not written by "
            "ModelParallelStrategy. Fix: resume from an earlier checkpoint."
        )
        raise CheckpointError(msg)
    meta = checkpoint_io.load_checkpoint(meta_path)
    if meta.get("model_parallel", {}).get("format") != FORMAT:
        msg = f"{meta_path!r} is not a ModelParallelStrategy checkpoint (no model_parallel.format == {FORMAT!r})."
        raise CheckpointError(msg)
    return meta


def saved_shapes(path: PathLike) -> dict[str, tuple[int, ...]]:
    """Model tensor name -> global shape, from DCP's metadata."""
    prefix = MODEL_KEY + "."
    metadata = FileSystemReader(os.fspath(path)).read_metadata()
    return {
        key[len(prefix) :]: tuple(item.size)
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(item, TensorStorageMetadata)
    }


def _state(model: nn.Module, optimizers: list[Optimizer]) -> dict[str, Any]:
    state: dict[str, Any] = {MODEL_KEY: get_model_state_dict(model)}
    if optimizers:
        state[OPTIMIZER_KEY] = {str(i): get_optimizer_state_dict(model, opt) for i, opt in enumerate(optimizers)}
    return state


def save_distributed(
    checkpoint: dict[str, Any],
    path: PathLike,
    *,
    model: nn.Module,
    optimizers: list[Optimizer],
    checkpoint_io: CheckpointIO,
    is_global_zero: bool,
    barrier: Callable[[], None],
    layout: dict[str, int],
) -> None:
    """Every rank writes its shards into a staging directory; rank 0 adds ``trainer_state.pt`` and publishes it.

    The directory appears under ``path`` only once complete (:mod:`phalanx.checkpoint_io.atomic`), so
    a rank killed mid-save leaves the previous checkpoint intact, and shards of a larger world
    cannot linger.
    """
    staging = staging_directory(path)
    if is_global_zero:
        prepare_staging(path)
    barrier()
    dcp.save(_state(model, optimizers), storage_writer=FileSystemWriter(os.fspath(staging)))
    barrier()
    if is_global_zero:
        meta = {k: v for k, v in checkpoint.items() if k not in (MODEL_KEY, OPTIMIZER_KEY, *_DROPPED)}
        meta["model_parallel"] = {"format": FORMAT, "version": 1, "layout": dict(layout), "num_optimizers": len(optimizers)}
        checkpoint_io.save_checkpoint(meta, os.path.join(staging, META_FILE))
        publish_directory(staging, path)
    barrier()


def check_model_matches(
    model: nn.Module, shapes: dict[str, tuple[int, ...]], *, source: str, strict: bool, partial: bool
) -> None:
    """Refuse a checkpoint of another model, naming what differs.

    Args:
        partial: This rank holds only part of the model (pipeline stages), so checkpoint entries it
            does not hold are expected.

    Raises:
        CheckpointError: Missing or differently shaped tensors (and, when not partial and strict,
            unexpected ones).
    """
    expected = {name: tuple(t.shape) for name, t in get_model_state_dict(model).items() if hasattr(t, "shape")}
    missing = [k for k in expected if k not in shapes]
    unexpected = [] if partial else [k for k in shapes if k not in expected]
    reshaped = [f"{k}: checkpoint {shapes[k]} vs model {v}" for k, v in expected.items() if k in shapes and shapes[k] != v]
    if reshaped or (strict and (missing or unexpected)):
        parts = [f"Checkpoint {source!r} does not fit the model {type(model).__qualname__}:"]
        if reshaped:
            parts.append(f"shape mismatch {reshaped[:3]};")
        if missing:
            parts.append(f"missing keys {missing[:5]};")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:5]};")
        parts.append("Fix: pass a checkpoint of this model (any mesh shape loads), or set strict_loading = False for key differences.")
        raise CheckpointError(" ".join(parts))


def read_distributed(
    path: PathLike,
    *,
    model: nn.Module,
    optimizers: list[Optimizer],
    checkpoint_io: CheckpointIO,
    strict: bool,
    partial: bool,
) -> dict[str, Any]:
    """Read a distributed checkpoint into state dicts shaped like this run's shards (resharding).

    Raises:
        CheckpointError: Another model, another number of optimizers, or unreadable shards.
    """
    path = os.fspath(path)
    meta = read_meta(path, checkpoint_io)
    check_model_matches(model, saved_shapes(path), source=path, strict=strict, partial=partial)
    saved = meta["model_parallel"].get("num_optimizers", 0)
    if optimizers and saved != len(optimizers):
        msg = (
            f"The checkpoint {path!r} holds {saved} optimizer state(s) but configure_optimizers created "
            f"{len(optimizers)}. Fix: resume with the optimizers the checkpoint was trained with."
        )
        raise CheckpointError(msg)
    state = _state(model, optimizers)
    try:
        dcp.load(state, storage_reader=FileSystemReader(path))
    except (Exception, CheckpointException) as error:  # DCP's own type derives from BaseException only
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        msg = (
            f"Could not load the distributed checkpoint {path!r}: {first}. A different optimizer type than the one "
            "it was trained with is the usual cause; fix: resume with the same configure_optimizers."
        )
        raise CheckpointError(msg) from error
    meta[MODEL_KEY] = state[MODEL_KEY]
    if optimizers:
        meta[OPTIMIZER_KEY] = [state[OPTIMIZER_KEY][str(i)] for i in range(len(optimizers))]
    return meta
