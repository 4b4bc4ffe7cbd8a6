"""Publish a checkpoint directory all at once, so a killed writer never leaves a partial one.

Sharded checkpoints (FSDP's DCP directories, DeepSpeed's engine directories) are written by many
processes, file by file. Written in place, a ``kill -9`` halfway through would leave a directory
that looks like a checkpoint, and overwriting ``last.ckpt`` in place would first destroy the
previous one. Instead every rank writes into a *staging* directory beside the target, whose name
starts with a dot and does not end with ``.ckpt`` (so ``ckpt_path="last"`` never picks it), and
rank 0 publishes it with one rename once every rank has finished. An existing target is swapped
atomically (Linux ``renameat2(RENAME_EXCHANGE)``) and only then deleted, so at every instant the
target path holds either the complete old checkpoint or the complete new one.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from pathlib import Path

from phalanx.checkpoint_io.checkpoint_io import PathLike

__all__ = ["is_staging_name", "prepare_staging", "publish_directory", "staging_directory"]

_STAGING_SUFFIX = ".partial"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def staging_directory(target: PathLike) -> Path:
    """The staging directory for ``target`` (deterministic: every rank computes the same path)."""
    path = Path(os.fspath(target))
    return path.parent / f".{path.name}{_STAGING_SUFFIX}"


def is_staging_name(name: str) -> bool:
    """Whether ``name`` is a staging (unfinished) checkpoint's name; such entries are never resumed from."""
    return name.startswith(".") and name.endswith(_STAGING_SUFFIX)


def prepare_staging(target: PathLike) -> Path:
    """Create an empty staging directory for ``target`` (rank 0 only), removing a stale one.

    A stale staging directory is what a writer killed earlier left behind.
    """
    staging = staging_directory(target)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux); False where the call is unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return bool(result == 0)


def publish_directory(staging: PathLike, target: PathLike) -> None:
    """Move the finished ``staging`` directory to ``target`` in one step (rank 0 only).

    An existing ``target`` (directory or file) is swapped out atomically and then deleted; where
    the atomic swap is unavailable it is renamed away first (a short window in which ``target``
    is missing, but never partial).
    """
    staging, target = Path(os.fspath(staging)), Path(os.fspath(target))
    if not target.exists():
        os.rename(staging, target)
    elif target.is_dir() and _exchange(staging, target):
        shutil.rmtree(staging)  # now holds the previous checkpoint
    else:
        old = target.parent / f".{target.name}.old{_STAGING_SUFFIX}"
        if old.exists():
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        os.rename(target, old)
        os.rename(staging, target)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    _fsync_parent(target)


def _fsync_parent(target: Path) -> None:
    try:
        fd = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
