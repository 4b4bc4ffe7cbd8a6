"""Checkpoints of XLA tensors: one file from the master ordinal, or a sharded DCP folder.

XLA tensors cannot be pickled as they are: they live in the runtime, and an SPMD-sharded one
exists only as pieces on several devices. Full checkpoints therefore bring every tensor to the
CPU first (gathering shards), on every replica (each must take part in the transfer), and then
only the master ordinal writes, like ``xm.save``, through the core's atomic writer. Sharded
checkpoints use ``torch.distributed.checkpoint`` with torch-xla's SPMD planners, so each shard is
written from the device that holds it and no host ever needs the whole model in memory. A sharded
save goes through the core's staging (``phalanx.checkpoint_io.atomic``) like every other sharded
format: the shards go into a staging folder (or prefix, for a URL) that the master ordinal
publishes whole once they are written, so a replica killed mid-save leaves the previous
checkpoint as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from phalanx.checkpoint_io.atomic import committed_path, prepare_staging, publish_directory, staging_directory
from phalanx.checkpoint_io.checkpoint_io import PathLike
from phalanx.checkpoint_io.storage import filesystem, is_remote, join
from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx.utilities import apply_to_collection
from phalanx_strategy_xla._plugin import SHARDED_MARKER

__all__ = ["SHARDED_MARKER", "XLACheckpointIO", "load_sharded_to_cpu"]


def _to_cpu(data: Any) -> Any:
    return apply_to_collection(data, torch.Tensor, lambda t: t.detach().cpu() if t.device.type == "xla" else t)


class XLACheckpointIO(TorchCheckpointIO):
    """Save XLA state on the master ordinal (full) or shard by shard (``sharded=True``).

    Args:
        sharded: Write a ``torch.distributed.checkpoint`` folder with torch-xla's
            ``SPMDSavePlanner`` instead of one file. Meant for SPMD strategies (``xla_fsdp``).
    """

    def __init__(self, *, sharded: bool = False) -> None:
        self.sharded = sharded

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PathLike, storage_options: Any | None = None) -> None:
        """Write ``checkpoint``; call it on every replica (only the master ordinal writes).

        Raises:
            MisconfigurationError: ``storage_options`` was given (this IO takes none).
        """
        if storage_options is not None:
            msg = (
                f"XLACheckpointIO.save_checkpoint got storage_options={storage_options!r}, but it supports none; "
                "pass storage_options=None."
            )
            raise MisconfigurationError(msg)
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()  # pending lazy updates (the last optimizer step) must land before reading weights
        if self.sharded:
            self._save_sharded(checkpoint, os.fspath(path))
            return
        cpu_checkpoint = _to_cpu(checkpoint)
        if xm.is_master_ordinal(local=False):
            super().save_checkpoint(cpu_checkpoint, path)
        _rendezvous("phalanx_xla_checkpoint_saved")

    def _save_sharded(self, checkpoint: dict[str, Any], folder: str) -> None:
        """Write the shards into the staging folder, then the master ordinal publishes it whole."""
        import torch.distributed.checkpoint as dcp
        import torch_xla.core.xla_model as xm
        from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

        remote = is_remote(folder)
        if (not remote and os.path.isfile(folder)) or (remote and _remote_isfile(folder)):
            msg = f"Sharded checkpoint path {folder!r} is an existing file; pass a folder path (e.g. 'last.ckpt/')."
            raise MisconfigurationError(msg)
        master = xm.is_master_ordinal(local=False)
        staging = os.fspath(staging_directory(folder))
        if master:
            prepare_staging(folder)
        _rendezvous("phalanx_xla_checkpoint_staging")
        if remote:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

            writer: Any = FsspecWriter(staging)
        else:
            writer = dcp.FileSystemWriter(staging)
        dcp.save(checkpoint, storage_writer=writer, planner=SPMDSavePlanner(), no_dist=True)
        _rendezvous("phalanx_xla_checkpoint_shards")
        if master:
            marker = join(staging, SHARDED_MARKER)
            text = "torch.distributed.checkpoint written by phalanx-strategy-xla\n"
            if remote:
                fs, inner = filesystem(marker)
                fs.pipe_file(inner, text.encode())
            else:
                Path(marker).write_text(text)
            publish_directory(staging, folder)
        _rendezvous("phalanx_xla_checkpoint_published")

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: Any | None = None,
        *,
        weights_only: bool = True,
    ) -> dict[str, Any]:
        """Read a full file, or a sharded folder into one CPU checkpoint (any mesh can load it)."""
        if is_remote(path):
            complete = committed_path(path)
            if complete is not None and not _remote_isfile(complete):
                return load_sharded_to_cpu(complete)
            return super().load_checkpoint(path, map_location, weights_only=weights_only)
        target = Path(path)
        if target.is_dir():
            if not (target / SHARDED_MARKER).exists() and not (target / ".metadata").exists():
                msg = (
                    f"Checkpoint folder {str(target)!r} is not a sharded checkpoint (no .metadata inside); "
                    "pass the folder written by save_checkpoint or a checkpoint file."
                )
                raise CheckpointError(msg)
            return load_sharded_to_cpu(target)
        return super().load_checkpoint(path, map_location, weights_only=weights_only)

    def __repr__(self) -> str:
        return f"XLACheckpointIO(sharded={self.sharded})"


def _remote_isfile(url: str) -> bool:
    fs, inner = filesystem(url)
    return bool(fs.isfile(inner))


def load_sharded_to_cpu(folder: Path | str) -> dict[str, Any]:
    """Load a DCP folder into a nested dict of CPU tensors, without a template state dict.

    Raises:
        CheckpointError: The folder cannot be read as a ``torch.distributed.checkpoint``.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    try:
        text = os.fspath(folder)
        reader: Any = FsspecReader(text) if is_remote(text) else FileSystemReader(text)
        _load_state_dict(state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    except Exception as err:
        msg = f"Cannot read sharded checkpoint {str(folder)!r} ({type(err).__name__}: {err}); it may be incomplete."
        raise CheckpointError(msg) from err
    for optimizer_state in state.get("optimizer_states") or []:
        # DCP flattens keys to strings; torch optimizers index their state by int parameter ids.
        if isinstance(optimizer_state, dict) and isinstance(optimizer_state.get("state"), dict):
            optimizer_state["state"] = {_int_key(k): v for k, v in optimizer_state["state"].items()}
    return state


def _int_key(key: Any) -> Any:
    return int(key) if isinstance(key, str) and key.isdigit() else key


def _rendezvous(tag: str) -> None:
    """Wait for every replica of a multi-process run, so no rank reads a file still being written."""
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    if xr.world_size() > 1:
        xm.rendezvous(tag)
