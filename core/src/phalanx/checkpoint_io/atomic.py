"""Publish a checkpoint directory all at once, so a killed writer never leaves a partial one.

Sharded checkpoints (FSDP's DCP directories, DeepSpeed's engine directories) are written by many
processes, file by file. Written in place, a ``kill -9`` halfway through would leave a directory
that looks like a checkpoint, and overwriting ``last.ckpt`` in place would first destroy the
previous one. Instead every rank writes into a *staging* directory beside the target, whose name
starts with a dot and does not end with ``.ckpt`` (so ``ckpt_path="last"`` never picks it), and
rank 0 publishes it once every rank has finished.

On a local disk publishing is one rename: an existing target is swapped atomically (Linux
``renameat2(RENAME_EXCHANGE)``) and only then deleted, so at every instant the target path holds
either the complete old checkpoint or the complete new one.

Object stores (any fsspec URL) have no rename, so publishing is a two-step commit with markers:

1. the writers upload into the staging prefix; nothing refers to it yet, so a writer killed now
   leaves the previous checkpoint as it was (the stale prefix is ignored, and removed by the next
   :func:`prepare_staging`);
2. rank 0 writes the commit marker into the staging prefix: from now on the new checkpoint is
   complete and :func:`committed_path` resolves the target to the staging prefix;
3. the target's own marker is removed, its objects are deleted and the staged objects are copied
   over (server-side), the target's marker last: then the target is complete again and the staging
   prefix is deleted.

A writer killed in step 3 leaves a committed staging prefix: readers use it, and the next
:func:`prepare_staging` for that target finishes the copy first (roll forward). So at every
instant a target resolves to one complete checkpoint, the old one until step 2 and the new one
from then on.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from phalanx.checkpoint_io.checkpoint_io import PathLike
from phalanx.checkpoint_io.storage import filesystem, is_remote, join, parent_and_name

__all__ = [
    "COMMIT_MARKER",
    "committed_path",
    "fsync_directory",
    "is_staging_name",
    "prepare_staging",
    "publish_directory",
    "remove_published",
    "staging_directory",
]

#: Written last into a checkpoint directory on an object store: the directory is complete.
COMMIT_MARKER = ".phalanx-commit"
_STAGING_SUFFIX = ".partial"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def staging_directory(target: PathLike) -> Path | str:
    """The staging directory for ``target`` (deterministic: every rank computes the same path).

    A ``Path`` for a local target, a ``str`` URL for a remote one.
    """
    if is_remote(target):
        parent, name = parent_and_name(target)
        return join(parent, f".{name}{_STAGING_SUFFIX}")
    path = Path(os.fspath(target))
    return path.parent / f".{path.name}{_STAGING_SUFFIX}"


def is_staging_name(name: str) -> bool:
    """Whether ``name`` is a staging (unfinished) checkpoint's name; such entries are never resumed from."""
    return name.startswith(".") and name.endswith(_STAGING_SUFFIX)


def prepare_staging(target: PathLike) -> Path | str:
    """Create an empty staging directory for ``target`` (rank 0 only), removing a stale one.

    A stale staging directory is what a writer killed earlier left behind. On an object store a
    *committed* one (killed while publishing) is published first, so the newest complete
    checkpoint is never lost.
    """
    staging = staging_directory(target)
    if isinstance(staging, str):
        fs, staged = filesystem(staging)
        _, final = filesystem(target)
        fs.invalidate_cache()
        if fs.exists(f"{staged}/{COMMIT_MARKER}") and not fs.exists(f"{final}/{COMMIT_MARKER}"):
            _copy_committed(fs, staged, final)
        _remove_tree(fs, staged)
        fs.makedirs(staged, exist_ok=True)
        return staging
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
    """Make the finished ``staging`` directory the checkpoint at ``target`` (rank 0 only).

    Locally an existing ``target`` (directory or file) is swapped out atomically and then deleted;
    where the atomic swap is unavailable it is renamed away first (a short window in which
    ``target`` is missing, but never partial). On an object store, the commit protocol of this
    module's docstring.
    """
    if is_remote(target):
        fs, staged = filesystem(staging)
        _, final = filesystem(target)
        stamp = {"target": os.fspath(target), "committed_ns": time.time_ns()}
        fs.pipe_file(f"{staged}/{COMMIT_MARKER}", json.dumps(stamp).encode())
        _copy_committed(fs, staged, final)
        _remove_tree(fs, staged)
        return
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
    fsync_directory(target.parent)


def _copy_committed(fs: Any, staged: str, final: str) -> None:
    """Step 3: un-commit ``final``, replace its objects by the staged ones, commit it again."""
    _remove_tree(fs, final)
    marker = f"{staged}/{COMMIT_MARKER}"
    for source in sorted(fs.find(staged)):
        if source != marker:
            fs.copy(source, final + source[len(staged) :])
    fs.copy(marker, f"{final}/{COMMIT_MARKER}")
    fs.invalidate_cache()


def _remove_tree(fs: Any, path: str) -> None:
    """Delete ``path`` (object, or every object under the prefix), its commit marker first."""
    fs.invalidate_cache()
    if fs.isfile(path):
        fs.rm_file(path)
        return
    marker = f"{path}/{COMMIT_MARKER}"
    if fs.exists(marker):
        fs.rm_file(marker)
    found = fs.find(path)
    if found:
        fs.rm(found)
    if fs.exists(path):  # directory entries of hierarchical stores (memory://, local through fsspec)
        fs.rm(path, recursive=True)
    fs.invalidate_cache()


def committed_path(path: PathLike) -> str | None:
    """The complete checkpoint ``path`` names right now, or None where there is none.

    A local path is returned as it is when it exists (rename made it complete). A remote file is
    complete (an object store's upload replaces an object whole). A remote directory is complete
    with its commit marker; without one, a committed staging prefix (a publish that was
    interrupted) holds the checkpoint.
    """
    text = os.fspath(path)
    if not is_remote(text):
        return text if os.path.exists(text) else None
    fs, inner = filesystem(text)
    fs.invalidate_cache()
    if fs.isfile(inner):
        return text
    if fs.exists(f"{inner}/{COMMIT_MARKER}"):
        return text
    staging = staging_directory(text)
    fs_staged, staged = filesystem(staging)
    if fs_staged.exists(f"{staged}/{COMMIT_MARKER}"):
        return os.fspath(staging)
    return None


def remove_published(path: PathLike) -> None:
    """Delete the checkpoint at ``path`` (file or directory, local or remote); missing is fine.

    On a store the commit marker goes first, so a reader never takes a half-deleted directory
    for a complete one.
    """
    text = os.fspath(path)
    if is_remote(text):
        fs, inner = filesystem(text)
        _remove_tree(fs, inner)
        return
    target = Path(text)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()


def fsync_directory(directory: Path) -> None:
    """Persist a rename inside ``directory``; without it a power loss can undo the replace."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)
