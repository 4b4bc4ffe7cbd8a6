"""Sharded checkpoints: one DCP directory format for every strategy whose state lives on all ranks.

Part of the plugin-author API. A strategy whose weights and optimizer state are DTensor shards
(``fsdp``, ``model_parallel``, a vendor's) saves and reads them here instead of writing its own
copy of the format, so staging, remote storage, background writes and the "does this checkpoint
fit this model" check are written once and behave alike everywhere.

The format (names in :mod:`phalanx.checkpoint_io._dcp_format`): a directory with
``torch.distributed.checkpoint``'s ``.metadata`` and one shard file per writing rank, keyed by the
full model's parameter names, plus ``meta.pt`` (rank 0) holding the Trainer's other state and the
``"dcp"`` marker. DCP records every tensor's global shape and every shard's offsets, so a
checkpoint written on N ranks (or one mesh shape) loads on M ranks (or another): each rank reads
just the slices its own shards cover. ``phalanx checkpoint convert`` turns one into a portable
single file in one process, without a process group.

Saving is atomic: every rank writes into a staging directory beside the target, and rank 0
publishes it (:mod:`phalanx.checkpoint_io.atomic`) once every rank has finished, so a killed run
leaves the previous checkpoint at the path intact. With ``Trainer(plugins=[AsyncCheckpointIO()])``
the shards are copied to CPU memory while the loop waits and written by a background thread
(torch's ``async_save``); the directory is published only when every rank's write is done. Paths
may be fsspec URLs (``s3://...``): DCP's fsspec writer and reader serve them.

The save and read functions are collective: all ranks call them together.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.optim import Optimizer

from phalanx.checkpoint_io import _dcp_async
from phalanx.checkpoint_io._dcp_format import (
    FORMAT,
    MARKER_KEY,
    META_FILE,
    MODEL_KEY,
    OPTIMIZER_KEY,
    format_marker,
    has_dcp_metadata,
    is_dcp_checkpoint,
    meta_file,
)
from phalanx.checkpoint_io._dcp_state import (
    apply_model_state,
    apply_optimizer_states,
    check_model_matches,
    load_optimizer_hyperparameters,
    require_entry,
)
from phalanx.checkpoint_io.async_io import AsyncCheckpointIO
from phalanx.checkpoint_io.atomic import committed_path, prepare_staging, publish_directory, staging_directory
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.checkpoint_io.checks import check_optimizer_count
from phalanx.checkpoint_io.storage import is_remote, join
from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
from phalanx.errors import CheckpointError

__all__ = [
    "META_FILE",
    "MODEL_KEY",
    "OPTIMIZER_KEY",
    "apply_model_state",
    "apply_optimizer_states",
    "check_model_matches",
    "convert_to_portable",
    "finish_saves",
    "has_dcp_metadata",
    "is_dcp_checkpoint",
    "load_full_model_state",
    "load_optimizer_hyperparameters",
    "read",
    "read_from_shards",
    "read_meta",
    "require_entry",
    "save",
    "saved_shapes",
    "sharded_state",
]

log = logging.getLogger(__name__)
#: Trainer keys never stored in ``meta.pt``: mid-accumulation gradients live in the sharded
#: parameters' own buffers (FSDP) or as per-shard DTensors, which the Trainer's plain copy cannot hold.
_DROPPED = ("accumulated_grads",)


def _writer(path: str) -> Any:
    if is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(path)
    return torch_dcp.FileSystemWriter(path)


def _reader(path: str) -> Any:
    if is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(path)
    return torch_dcp.FileSystemReader(path)


def _committed(path: PathLike) -> str:
    """Where the complete checkpoint ``path`` names lives: on an object store, possibly a committed staging prefix."""
    text = os.fspath(path)
    return (committed_path(text) or text) if is_remote(text) else text


def sharded_state(model: nn.Module, optimizers: list[Optimizer]) -> dict[str, Any]:
    """This rank's model and optimizer state, keyed by parameter name (what resharding matches on)."""
    state: dict[str, Any] = {MODEL_KEY: get_model_state_dict(model)}
    if optimizers:
        state[OPTIMIZER_KEY] = {str(i): get_optimizer_state_dict(model, opt) for i, opt in enumerate(optimizers)}
    return state


def finish_saves(checkpoint_io: CheckpointIO, *, synchronize: bool = True) -> None:
    """Wait for a background save still in flight; re-raise its failure (naming the path).

    Call it before anything that needs the last checkpoint complete or the process group alive:
    the next save, a load, teardown. A no-op for a synchronous CheckpointIO.

    Args:
        checkpoint_io: The strategy's CheckpointIO.
        synchronize: Also wait for every rank (collective): each rank's wait covers its own write,
            but only rank 0 publishes, so a rank about to read the checkpoint must wait for rank 0.
            Pass False at teardown, which needs no published checkpoint and may follow a failure
            on one rank only.
    """
    if isinstance(checkpoint_io, AsyncCheckpointIO):
        checkpoint_io.wait()
        if synchronize and checkpoint_io.process_group is not None:
            dist.barrier(group=checkpoint_io.process_group)


def save(
    checkpoint: Mapping[str, Any],
    path: PathLike,
    *,
    model: nn.Module,
    optimizers: list[Optimizer],
    checkpoint_io: CheckpointIO,
    is_global_zero: bool,
    barrier: Callable[[], None],
    world_size: int,
    strategy: str,
    layout: Mapping[str, Any] | None = None,
) -> None:
    """Write a sharded checkpoint of ``model`` and ``optimizers`` to ``path`` (collective).

    The weights and optimizer state come from the live objects, keyed by parameter name, not from
    ``checkpoint`` (whose other entries go to ``meta.pt``). Synchronous unless ``checkpoint_io`` is
    an :class:`~phalanx.checkpoint_io.AsyncCheckpointIO`; then this returns once the shards are
    copied to CPU memory, and the write and the publish finish in the background. Either way only
    one save is in flight: a save first waits for the previous one.

    Args:
        checkpoint: The Trainer's checkpoint dict.
        path: The directory to publish (a local path or an fsspec URL).
        model: The sharded model.
        optimizers: Its optimizers (their state is saved by parameter name).
        checkpoint_io: Writes ``meta.pt``; an ``AsyncCheckpointIO`` makes the save asynchronous.
        is_global_zero: Whether this is rank 0 (which stages, writes ``meta.pt`` and publishes).
        barrier: The strategy's barrier.
        world_size: Ranks writing (recorded for diagnostics).
        strategy: The writing strategy's name (recorded for diagnostics).
        layout: Anything else worth recording, e.g. the mesh sizes.
    """
    started = time.perf_counter()
    finish_saves(checkpoint_io)
    target = os.fspath(path)
    staging = os.fspath(staging_directory(target))
    if is_global_zero:
        prepare_staging(target)
    barrier()
    if is_global_zero:
        meta = {key: value for key, value in checkpoint.items() if key not in (MODEL_KEY, OPTIMIZER_KEY, *_DROPPED)}
        meta[MARKER_KEY] = {
            "format": FORMAT,
            "version": 1,
            "strategy": strategy,
            "world_size": world_size,
            "num_optimizers": len(optimizers),
            "layout": dict(layout or {}),
        }
        inner = checkpoint_io.checkpoint_io if isinstance(checkpoint_io, AsyncCheckpointIO) else checkpoint_io
        inner.save_checkpoint(meta, join(staging, META_FILE))
    state = sharded_state(model, optimizers)
    if isinstance(checkpoint_io, AsyncCheckpointIO):
        _dcp_async.save_in_background(
            state,
            _writer(staging),
            staging=staging,
            target=target,
            checkpoint_io=checkpoint_io,
            is_global_zero=is_global_zero,
            started=started,
        )
        return
    torch_dcp.save(state, storage_writer=_writer(staging))  # collective: .metadata once all shards are written
    if is_global_zero:
        publish_directory(staging, target)
        log.info(
            "checkpoint %s: blocked %.2f s (synchronous save)",
            os.path.basename(target.rstrip("/")),
            time.perf_counter() - started,
        )
    barrier()


def read_meta(path: PathLike, checkpoint_io: CheckpointIO | None = None) -> dict[str, Any]:
    """The Trainer state stored beside the shards (``meta.pt``).

    Raises:
        CheckpointError: No marker file (an interrupted save, or a DCP directory not written by
            phalanx), or one that does not name this format.
    """
    source = _committed(path)
    found = meta_file(source)
    if found is None:
        msg = (
            f"{source!r} holds DCP shards but no {META_FILE}: the save was interrupted, or the directory was not "
            "written by a phalanx strategy. Fix: resume from an earlier checkpoint."
        )
        raise CheckpointError(msg)
    io = checkpoint_io.checkpoint_io if isinstance(checkpoint_io, AsyncCheckpointIO) else checkpoint_io
    meta = (io or TorchCheckpointIO()).load_checkpoint(found)
    marker = format_marker(meta) if isinstance(meta, dict) else None
    if marker is None:
        msg = f"{found!r} is not a phalanx sharded-checkpoint file (no {MARKER_KEY!r} entry naming {FORMAT!r}); pass a checkpoint written by a sharded strategy."
        raise CheckpointError(msg)
    meta[MARKER_KEY] = marker
    return meta


def _metadata(path: str) -> Metadata:
    return _reader(path).read_metadata()  # type: ignore[no-any-return]


def saved_shapes(path: PathLike) -> dict[str, tuple[int, ...] | None]:
    """Model entry name -> global shape (``None`` for non-tensor entries), read from DCP's index."""
    prefix = MODEL_KEY + "."
    return {
        key[len(prefix) :]: tuple(item.size) if isinstance(item, TensorStorageMetadata) else None
        for key, item in _metadata(os.fspath(path)).state_dict_metadata.items()
        if key.startswith(prefix)
    }


def read(
    path: PathLike,
    *,
    model: nn.Module,
    optimizers: list[Optimizer],
    checkpoint_io: CheckpointIO,
    strict: bool = True,
    partial: bool = False,
) -> dict[str, Any]:
    """Read a sharded checkpoint into state dicts shaped like this run's shards (resharding; collective).

    DCP fills templates taken from the live model and optimizers, so each rank reads just the
    slices its shards cover. Nothing is applied yet (:func:`apply_model_state`,
    :func:`apply_optimizer_states`).

    Returns:
        ``meta.pt``'s Trainer state plus ``"state_dict"`` (name-keyed shards) and, when
        ``optimizers`` are given, ``"optimizer_states"`` (one name-keyed sharded state each).

    Raises:
        CheckpointError: Another model, another number of optimizers, or unreadable shards.
    """
    finish_saves(checkpoint_io)  # the checkpoint asked for may be the one still being written
    source = _committed(path)
    meta = read_meta(source, checkpoint_io)
    check_model_matches(model, saved_shapes(source), source=source, strict=strict, partial=partial)
    saved = int(meta[MARKER_KEY].get("num_optimizers", len(optimizers)))
    if optimizers:
        check_optimizer_count(saved, len(optimizers), source=source)
    state = sharded_state(model, optimizers)
    try:
        torch_dcp.load(state, storage_reader=_reader(source))
    except (Exception, CheckpointException) as error:  # DCP's own type derives from BaseException only
        msg = (
            f"Could not load the sharded checkpoint {source!r}: {_dcp_async.first_cause(error)}. A different optimizer "
            "type than the one it was trained with is the usual cause; fix: resume with the same "
            "configure_optimizers, or load the weights only."
        )
        raise CheckpointError(msg) from error
    meta[MODEL_KEY] = state[MODEL_KEY]
    if optimizers:
        meta[OPTIMIZER_KEY] = [state[OPTIMIZER_KEY][str(i)] for i in range(len(optimizers))]
    return meta


def read_from_shards(checkpoint: Any) -> bool:
    """Whether ``checkpoint`` came from :func:`read` (already shaped like this run's shards).

    Judged by the marker, not by the presence of DTensors: a stateless optimizer (SGD without
    momentum) or a mesh of size 1 holds none, and must still be applied as sharded state.
    """
    return isinstance(checkpoint, Mapping) and format_marker(checkpoint) is not None


def load_full_model_state(source: PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """The full (unsharded) model state dict and the Trainer state of a sharded checkpoint.

    Runs in one process without a process group (DCP's ``no_dist`` mode): the index gives every
    model tensor's global shape and dtype, so full-size tensors are allocated and DCP fills them
    from all ranks' shard files, whatever mesh wrote them. Optimizer shards are not read.

    Raises:
        CheckpointError: ``source`` is not a complete phalanx sharded checkpoint.
    """
    path = _committed(source)
    meta = read_meta(path)
    reader = _reader(path)
    prefix = MODEL_KEY + "."
    tensors: dict[str, Any] = {}
    for key, item in reader.read_metadata().state_dict_metadata.items():
        if key.startswith(prefix) and isinstance(item, TensorStorageMetadata):
            tensors[key[len(prefix) :]] = torch.empty(tuple(item.size), dtype=item.properties.dtype)
    state = {MODEL_KEY: tensors}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        torch_dcp.load(state, storage_reader=reader, no_dist=True)
    return state[MODEL_KEY], meta


def convert_to_portable(source: str, destination: str) -> bool | None:
    """Write the sharded checkpoint ``source`` as one portable file; ``None`` when it is not one.

    A DCP directory without phalanx's marker file is passed on (``None``) too, so that another
    installed format may claim it.
    """
    if not is_dcp_checkpoint(source):
        return None
    from phalanx.checkpoint_io.portable import write_portable_checkpoint

    state_dict, meta = load_full_model_state(source)
    write_portable_checkpoint(state_dict, destination, source=source, extra=meta)
    return True
