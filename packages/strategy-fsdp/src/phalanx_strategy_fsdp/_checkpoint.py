"""Sharded and full FSDP checkpoints through ``torch.distributed.checkpoint`` (DCP).

A *sharded* checkpoint is a directory: DCP's ``.metadata`` plus one ``__<rank>_0.distcp`` file per
rank, written by every rank in parallel, and ``meta.pt`` (rank 0) with the rest of the Trainer's
state (loops, callbacks, schedulers, precision). DCP records each tensor's global shape and every
shard's offsets, so a checkpoint written by N ranks loads on M ranks: each rank reads just the
slices its own shards cover. A *full* checkpoint is one ordinary phalanx file written by rank 0,
with the unsharded weights and position-keyed optimizer state, loadable by any strategy.

Every function here is collective: all ranks must call it together.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from phalanx.checkpoint_io.atomic import prepare_staging, publish_directory, staging_directory
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.errors import CheckpointError
from phalanx_strategy_fsdp._state import check_model_matches, full_to_plain, optimizer_fqns, to_fqn_keys, to_index_keys

__all__ = [
    "META_FILE",
    "MODEL_KEY",
    "OPTIMIZER_KEY",
    "is_sharded_checkpoint",
    "load_full_model",
    "load_full_optimizers",
    "holds_shards",
    "read_from_shards",
    "load_sharded_model",
    "load_sharded_optimizers",
    "read_sharded",
    "read_sharded_meta",
    "save_full",
    "save_sharded",
    "saved_model_shapes",
]

META_FILE = "meta.pt"
MODEL_KEY = "state_dict"
OPTIMIZER_KEY = "optimizer_states"
FORMAT = "phalanx-fsdp-sharded"
#: Trainer keys that cannot be stored as they are: mid-accumulation gradients live inside FSDP's
#: unsharded buffers, not in ``param.grad``, so the Trainer's copy would be wrong (see docs/fsdp.md).
_DROPPED = ("accumulated_grads",)
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def is_sharded_checkpoint(path: PathLike) -> bool:
    """Whether ``path`` is a DCP directory (this plugin's sharded format)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, ".metadata"))


def read_sharded_meta(path: PathLike, checkpoint_io: CheckpointIO) -> dict[str, Any]:
    """The Trainer state stored next to the shards.

    Raises:
        CheckpointError: ``meta.pt`` is missing (an interrupted save, or a DCP directory that was
            not written by phalanx).
    """
    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
        msg = (
            f"{str(path)!r} holds DCP shards but no {META_FILE}: the save was interrupted, or the directory was "
            "not written by phalanx's FSDPStrategy. Fix: resume from an earlier checkpoint."
        )
        raise CheckpointError(msg)
    meta = checkpoint_io.load_checkpoint(meta_path)
    if meta.get("fsdp", {}).get("format") != FORMAT:
        msg = f"{meta_path!r} is not a phalanx FSDP metadata file (no 'fsdp.format' == {FORMAT!r}); pass a checkpoint written by FSDPStrategy."
        raise CheckpointError(msg)
    return meta


def _metadata(path: PathLike) -> Metadata:
    return FileSystemReader(os.fspath(path)).read_metadata()


def saved_model_shapes(metadata: Metadata) -> dict[str, tuple[int, ...] | None]:
    """Model entry name -> global shape (``None`` for non-tensor entries), from DCP's metadata."""
    prefix = MODEL_KEY + "."
    return {
        key[len(prefix) :]: tuple(item.size) if isinstance(item, TensorStorageMetadata) else None
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith(prefix)
    }


def _saved_optimizer_count(metadata: Metadata) -> int:
    prefix = OPTIMIZER_KEY + "."
    return len({key[len(prefix) :].split(".", 1)[0] for key in metadata.state_dict_metadata if key.startswith(prefix)})


def _sharded_state(model: nn.Module, optimizers: list[Optimizer]) -> dict[str, Any]:
    state: dict[str, Any] = {MODEL_KEY: get_model_state_dict(model)}
    if optimizers:
        state[OPTIMIZER_KEY] = {str(i): get_optimizer_state_dict(model, opt) for i, opt in enumerate(optimizers)}
    return state


def save_sharded(
    checkpoint: dict[str, Any],
    path: PathLike,
    *,
    model: nn.Module,
    optimizers: list[Optimizer],
    checkpoint_io: CheckpointIO,
    is_global_zero: bool,
    barrier: Callable[[], None],
    world_size: int,
) -> None:
    """Every rank writes its shards into a staging directory; rank 0 adds ``meta.pt`` and publishes it.

    The directory appears under ``path`` only once complete (see :mod:`phalanx.checkpoint_io.atomic`),
    so a rank killed mid-save leaves the previous checkpoint at ``path`` intact and loadable, and
    stale shards of a larger world cannot linger. The model and optimizer state are taken from the
    live objects (not from ``checkpoint``), keyed by parameter name, which is what makes resharding
    on load possible.
    """
    staging = staging_directory(path)
    if is_global_zero:
        prepare_staging(path)
    barrier()
    # dcp.save is collective: rank 0 writes .metadata once every rank has written its shards.
    dcp.save(_sharded_state(model, optimizers), storage_writer=FileSystemWriter(os.fspath(staging)))
    if is_global_zero:
        meta = {key: value for key, value in checkpoint.items() if key not in (MODEL_KEY, OPTIMIZER_KEY, *_DROPPED)}
        meta["fsdp"] = {"format": FORMAT, "version": 1, "world_size": world_size, "num_optimizers": len(optimizers)}
        checkpoint_io.save_checkpoint(meta, os.path.join(staging, META_FILE))
        publish_directory(staging, path)
    barrier()


def read_sharded(
    path: PathLike,
    *,
    model: nn.Module,
    optimizers: list[Optimizer],
    checkpoint_io: CheckpointIO,
    strict: bool = True,
) -> dict[str, Any]:
    """Read a sharded checkpoint into state dicts shaped like this run's shards (resharding N -> M).

    DCP fills templates taken from the live sharded model and optimizers, so each rank reads just
    the slices its own shards cover; nothing is applied yet (see :func:`load_sharded_states`).

    Returns:
        The Trainer state from ``meta.pt`` plus ``"state_dict"`` (DTensor shards, name-keyed) and,
        when ``optimizers`` are given, ``"optimizer_states"`` (one name-keyed sharded state each).

    Raises:
        CheckpointError: Another model, another number of optimizers, or unreadable shards.
    """
    meta = read_sharded_meta(path, checkpoint_io)
    metadata = _metadata(path)
    check_model_matches(model, saved_model_shapes(metadata), source=os.fspath(path), strict=strict)
    saved_optimizers = _saved_optimizer_count(metadata)
    if optimizers and saved_optimizers != len(optimizers):
        msg = (
            f"The checkpoint {os.fspath(path)!r} holds {saved_optimizers} optimizer state(s) but configure_optimizers "
            f"created {len(optimizers)}. Fix: resume with the optimizers the checkpoint was trained with."
        )
        raise CheckpointError(msg)
    state = _sharded_state(model, optimizers)
    try:
        dcp.load(state, storage_reader=FileSystemReader(os.fspath(path)))
    except (Exception, CheckpointException) as error:  # DCP's own type derives from BaseException only
        msg = (
            f"Could not load the sharded checkpoint {os.fspath(path)!r}: {_first_cause(error)}. "
            "A different optimizer type than the one it was trained with is the usual cause; fix: resume with the "
            "same configure_optimizers, or load weights only."
        )
        raise CheckpointError(msg) from error
    meta[MODEL_KEY] = state[MODEL_KEY]
    if optimizers:
        meta[OPTIMIZER_KEY] = [state[OPTIMIZER_KEY][str(index)] for index in range(len(optimizers))]
    return meta


def read_from_shards(checkpoint: Any) -> bool:
    """Whether ``checkpoint`` came from :func:`read_sharded` (its ``meta.pt`` names this format).

    Content alone cannot tell: a stateless optimizer (SGD without momentum) has no DTensor in its
    sharded state, which must still be applied as sharded, not as a full state.
    """
    return isinstance(checkpoint, dict) and checkpoint.get("fsdp", {}).get("format") == FORMAT


def holds_shards(state: Any) -> bool:
    """Whether a (nested) state dict holds DTensor shards, i.e. came from :func:`read_sharded`."""
    if isinstance(state, DTensor):
        return True
    if isinstance(state, dict):
        return any(holds_shards(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return any(holds_shards(value) for value in state)
    return False


def load_sharded_model(model: nn.Module, state_dict: dict[str, Any], *, strict: bool = True) -> None:
    """Apply a sharded model state dict from :func:`read_sharded` (collective)."""
    set_model_state_dict(model, state_dict, options=StateDictOptions(strict=strict))


def load_sharded_optimizers(model: nn.Module, optimizers: list[Optimizer], states: list[dict[str, Any]]) -> None:
    """Apply sharded optimizer states from :func:`read_sharded` (collective)."""
    for optimizer, state in zip(optimizers, states):
        if not state.get("state"):
            load_hyperparameters(optimizer, state)
        else:
            set_optimizer_state_dict(model, optimizer, state)


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
    state_dict = full_to_plain(get_model_state_dict(model, options=_FULL))
    optimizer_states = [
        full_to_plain(get_optimizer_state_dict(model, optimizer, options=_FULL)) for optimizer in optimizers
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
    check_model_matches(model, shapes, source=source, strict=strict)
    set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True, strict=strict))


def load_full_optimizers(
    model: nn.Module, optimizers: list[Optimizer], states: list[dict[str, Any]], *, source: str
) -> None:
    """Load position- or name-keyed full optimizer states (from fsdp "full", ddp or single_device files).

    Raises:
        CheckpointError: A different number of optimizers.
    """
    if len(states) != len(optimizers):
        msg = (
            f"The checkpoint {source!r} holds {len(states)} optimizer state(s) but configure_optimizers created "
            f"{len(optimizers)}. Fix: resume with the optimizers the checkpoint was trained with."
        )
        raise CheckpointError(msg)
    for optimizer, state in zip(optimizers, states):
        if not state.get("state"):
            load_hyperparameters(optimizer, state)
            continue
        named = to_fqn_keys(state, optimizer_fqns(model, optimizer))
        set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))


def load_hyperparameters(optimizer: Optimizer, state: dict[str, Any]) -> None:
    """Restore only the param groups' settings (lr, momentum, ...) of a state with no per-parameter entries.

    An optimizer that keeps no per-parameter state (plain SGD) saves an empty ``"state"``; torch's
    ``set_optimizer_state_dict`` cannot place such a state on a device and raises, although there is
    nothing to place. The groups are matched by position, as ``Optimizer.load_state_dict`` does.
    """
    saved = state.get("param_groups", [])
    if len(saved) != len(optimizer.param_groups):
        msg = (
            f"The checkpoint's optimizer has {len(saved)} parameter group(s) but configure_optimizers created "
            f"{len(optimizer.param_groups)}. Fix: resume with the optimizer the checkpoint was trained with."
        )
        raise CheckpointError(msg)
    for group, saved_group in zip(optimizer.param_groups, saved):
        group.update({key: value for key, value in saved_group.items() if key != "params"})


def _first_cause(error: BaseException) -> str:
    """One line saying what went wrong: DCP's own exception only lists ranks, its ``failures`` the cause."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, cause = next(iter(failures.items()))
        cause = getattr(cause, "exc", cause)  # some torch versions wrap it with the traceback
        return f"rank {rank}: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__
