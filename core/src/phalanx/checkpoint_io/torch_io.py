"""Checkpoints as ``torch.save`` files, written atomically and loaded safely.

A run killed while writing ``last.ckpt`` must not lose the previous ``last.ckpt``: the file is
written to a temporary name in the same directory, fsynced, and renamed over the target (rename is
atomic within one filesystem). A URL (``s3://``, ``gs://``, ``memory://``...) is written through
fsspec in one upload, which object stores apply whole (a killed upload leaves the previous object),
and read through fsspec. Loading defaults to ``weights_only=True`` so opening a checkpoint
from an untrusted source cannot execute code.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import pickle
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from phalanx.checkpoint_io.atomic import fsync_directory, remove_published
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.checkpoint_io.storage import filesystem, is_remote, remote_error
from phalanx.errors import CheckpointError, MisconfigurationError

__all__ = ["TorchCheckpointIO"]


@functools.cache
def _umask() -> int:
    """The process umask, read once (os.umask can only be read by setting it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _is_weights_only_refusal(path: Path, error: BaseException) -> bool:
    """Tell "valid file with objects weights_only refuses" from "garbage the unpickler choked on".

    torch reports both as "Weights only load failed"; a real refusal names the offending global,
    or comes from a well-formed torch.save archive (always a zip file since torch 1.6).
    """
    text = str(error)
    if "Weights only load failed" not in text:
        return False
    return "Unsupported global" in text or zipfile.is_zipfile(path)


def _weights_only_reason(error: BaseException) -> str:
    for line in str(error).splitlines():
        if "WeightsUnpickler error" in line:
            return line.strip()
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _save_remote(checkpoint: dict[str, Any], url: str, storage_options: dict[str, Any] | None) -> None:
    """Serialize in memory, then upload in one write (a store replaces the object whole or not at all).

    Serializing first means a failure of ``torch.save`` never starts an upload, and a store that
    cannot be reached fails before anything of the previous object is touched.
    """
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    try:
        fs, inner = filesystem(url, storage_options)
        parent = inner.rstrip("/").rpartition("/")[0]
        if parent:
            fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(inner, buffer.getvalue())
        fs.invalidate_cache()
    except Exception as error:  # botocore's credential and endpoint errors derive from Exception only
        raise CheckpointError(remote_error(url, error, action="write the checkpoint")) from error


class TorchCheckpointIO(CheckpointIO):
    """Checkpoints via ``torch.save`` / ``torch.load``: local files, or any fsspec URL."""

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: PathLike,
        storage_options: Any | None = None,
    ) -> None:
        """Atomically write ``checkpoint`` to ``path``, creating parent directories.

        Args:
            checkpoint: The state to store.
            path: A local path or an fsspec URL.
            storage_options: For a URL, keyword arguments of its fsspec file system (a dict);
                none for a local path.

        Raises:
            MisconfigurationError: ``storage_options`` given for a local path, or not a dict.
            CheckpointError: The store could not be written (the message names the URL).
        """
        if is_remote(path):
            if storage_options is not None and not isinstance(storage_options, dict):
                msg = (
                    f"TorchCheckpointIO.save_checkpoint got storage_options={storage_options!r}; for a URL it takes "
                    "a dict of the file system's options (e.g. {'anon': False}) or None."
                )
                raise MisconfigurationError(msg)
            _save_remote(checkpoint, os.fspath(path), storage_options)
            return
        if storage_options is not None:
            msg = (
                f"TorchCheckpointIO.save_checkpoint got storage_options={storage_options!r}, but it "
                "supports none; pass storage_options=None or use a CheckpointIO that accepts them."
            )
            raise MisconfigurationError(msg)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            # mkstemp creates 0600; give the file the permissions a plain open() would.
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        fsync_directory(target.parent)

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: Any | None = None,
        *,
        weights_only: bool = True,
    ) -> dict[str, Any]:
        """Load ``path``; tensors go to the CPU unless ``map_location`` says otherwise.

        Loading to CPU by default makes a checkpoint written on ``cuda:3`` open on any machine;
        strategies move the restored state to their device afterwards.

        Raises:
            CheckpointError: The file is missing, is not a valid checkpoint, or holds objects that
                ``weights_only=True`` refuses.
        """
        if is_remote(path):
            return self._load_remote(os.fspath(path), map_location, weights_only=weights_only)
        target = Path(path)
        if not target.is_file():
            if target.is_dir():
                msg = (
                    f"Checkpoint path {str(target)!r} is a directory, not a checkpoint file: a sharded checkpoint "
                    "(fsdp, deepspeed) loads only under the strategy that wrote it. Fix: resume with that strategy, "
                    f"or convert it with `phalanx checkpoint convert {target} {target}.portable.ckpt`, or pass "
                    "ckpt_path='last'."
                )
            else:
                msg = (
                    f"Checkpoint path {str(target)!r} does not exist. Check the path (ckpt_path=...) or pass "
                    "ckpt_path='last' to resume from the newest checkpoint."
                )
            raise CheckpointError(msg)
        location = "cpu" if map_location is None else map_location
        try:
            return torch.load(target, map_location=location, weights_only=weights_only)
        except pickle.UnpicklingError as error:
            if weights_only and _is_weights_only_refusal(target, error):
                msg = (
                    f"Checkpoint {str(target)!r} contains objects that weights_only=True refuses to "
                    f"unpickle ({_weights_only_reason(error)}). If you trust the file's source, load it "
                    "with weights_only=False; otherwise store only tensors and plain Python values."
                )
                raise CheckpointError(msg) from error
            raise CheckpointError(self._corrupt_message(target, error)) from error
        except (RuntimeError, EOFError, IndexError, ValueError, KeyError, OSError) as error:
            raise CheckpointError(self._corrupt_message(target, error)) from error

    def _load_remote(self, url: str, map_location: Any | None, *, weights_only: bool) -> dict[str, Any]:
        """Download ``url`` whole, then load it as a local file would be (same checks, same messages)."""
        try:
            fs, inner = filesystem(url)
            fs.invalidate_cache()
            if not fs.isfile(inner):
                is_dir = fs.isdir(inner)
                data = None
            else:
                data = fs.cat_file(inner)
        except Exception as error:  # the backend's errors (endpoint, credentials) vary by store
            raise CheckpointError(remote_error(url, error, action="read the checkpoint", untouched=False)) from error
        if data is None:
            what = (
                "is a directory, not a checkpoint file: a sharded checkpoint (fsdp, deepspeed) loads only under "
                "the strategy that wrote it. Fix: resume with that strategy, or pass ckpt_path='last'."
                if is_dir
                else "does not exist. Check the path (ckpt_path=...) or pass ckpt_path='last'."
            )
            msg = f"Checkpoint path {url!r} {what}"
            raise CheckpointError(msg)
        with tempfile.TemporaryDirectory(prefix="phalanx-ckpt-") as folder:
            local = Path(folder) / "checkpoint.ckpt"
            local.write_bytes(data)
            try:
                return self.load_checkpoint(local, map_location, weights_only=weights_only)
            except CheckpointError as error:
                raise CheckpointError(str(error).replace(str(local), url)) from error.__cause__

    @staticmethod
    def _corrupt_message(path: Path, error: BaseException) -> str:
        first_line = str(error).splitlines()[0] if str(error) else ""
        return (
            f"{str(path)!r} is not a valid checkpoint ({type(error).__name__}: {first_line}). The file "
            "may be truncated or not written by torch.save; pick another checkpoint file."
        )

    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete a checkpoint file, or a directory for sharded checkpoints; missing is fine."""
        if is_remote(path):
            remove_published(path)
            return
        target = Path(path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
