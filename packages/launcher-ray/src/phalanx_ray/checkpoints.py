"""Moving phalanx checkpoints into Ray Train's checkpoints and back.

A Ray Train checkpoint is a directory that Ray copies into the run's storage (``RunConfig(
storage_path=...)``: a shared folder or a bucket) and hands back, after a restart, through
``ray.train.get_checkpoint()``. A phalanx checkpoint is a ``*.ckpt`` file (single-process and DDP
strategies) or a ``*.ckpt`` directory (FSDP's DCP shards, DeepSpeed's engine folder), on a local
disk or at an fsspec URL. The layout that joins them is the plainest one: each Ray checkpoint
directory holds exactly one phalanx checkpoint, under the name phalanx gave it::

    <storage_path>/<run name>/checkpoint_2026-12-06_21-10-03.123456/
        last.ckpt                  # the file or directory phalanx wrote, copied as it is

So a Ray checkpoint can be loaded with anything that reads phalanx checkpoints
(``fit(ckpt_path=...)``, ``Module.load_from_checkpoint``, ``phalanx checkpoint convert``) once
:func:`checkpoint_path` has found the file in it.

Ray is imported inside the functions: this module is imported by the callback, whose registration
must not import Ray.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from phalanx.checkpoint_io.atomic import committed_path
from phalanx.checkpoint_io.storage import filesystem, is_remote, parent_and_name
from phalanx.errors import CheckpointError

if TYPE_CHECKING:
    from ray.train import Checkpoint

__all__ = ["INSTALL", "checkpoint_path", "latest_checkpoint", "require_ray_train", "stage_for_report"]

#: The command that installs what this package needs, for error messages.
INSTALL = "pip install 'ray[train]>=2.60'"
#: Prefix of the folders the checkpoints are staged in before Ray copies them (dot-named and not
#: ending in ``.ckpt``, so ``ckpt_path="last"`` never takes one for a checkpoint).
STAGING_PREFIX = ".ray-report-"


def require_ray_train() -> Any:
    """``ray.train``, or an ImportError that says how to install it."""
    try:
        import ray.train
    except ImportError as error:
        msg = f"phalanx_ray needs Ray Train, which is not installed here ({error}). Fix: {INSTALL}"
        raise ImportError(msg) from error
    return ray.train


def stage_for_report(path: str) -> str:
    """A new folder holding the checkpoint ``path`` under its own name, ready for ``ray.train.report``.

    Ray copies a *directory* into its storage, and a phalanx checkpoint may be a single file, so
    the checkpoint is placed in a folder of its own. A local checkpoint is hard-linked there (no
    bytes copied: phalanx replaces checkpoints by rename, never rewrites a file in place, so the
    links keep the content they were made with), in a dot-named folder beside it on the same
    disk; where links are impossible, it is copied. A checkpoint at an fsspec URL is downloaded
    into a local temporary folder (Ray then uploads it to its own storage). A ``last.ckpt``
    symlink (``ModelCheckpoint(save_last="link")``) is followed. The caller removes the folder.

    Raises:
        CheckpointError: ``path`` names no complete checkpoint.
    """
    parent, name = parent_and_name(path)
    if is_remote(path):
        complete = committed_path(path)
        if complete is None:
            msg = f"Cannot report the checkpoint {path!r} to Ray: it is missing or was never committed."
            raise CheckpointError(msg)
        staging = tempfile.mkdtemp(prefix="phalanx-ray-report-")
        fs, inner = filesystem(complete)
        target = os.path.join(staging, name)
        if fs.isdir(inner):
            fs.get(inner.rstrip("/") + "/", target, recursive=True)
        else:
            fs.get_file(inner, target)
        return staging
    source = os.path.realpath(path)
    if not os.path.exists(source):
        msg = f"Cannot report the checkpoint {path!r} to Ray: no such file or directory."
        raise CheckpointError(msg)
    try:
        staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent or ".")
    except OSError:  # a read-only checkpoint folder: stage (and copy) in the temporary folder
        staging = tempfile.mkdtemp(prefix="phalanx-ray-report-")
    target = os.path.join(staging, name)
    if os.path.isdir(source):
        shutil.copytree(source, target, copy_function=_link_or_copy)
    else:
        _link_or_copy(source, target)
    return staging


def _link_or_copy(source: str, target: str) -> str:
    """Hard-link ``source`` at ``target``; copy it where links are not possible (another disk)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    return target


def checkpoint_path(checkpoint: Checkpoint) -> str:
    """The phalanx checkpoint inside a Ray Train ``Checkpoint``, as a path ``fit(ckpt_path=...)`` reads.

    When Ray's storage is a local or shared folder, the path points straight into it; when it is
    a bucket, the checkpoint is downloaded into a local temporary folder first (every rank reads
    it, and a sharded checkpoint is read shard by shard).

    Raises:
        CheckpointError: The Ray checkpoint does not hold exactly one ``*.ckpt`` entry (it was not
            reported by :class:`~phalanx_ray.callback.RayTrainReportCallback`).
    """
    import pyarrow.fs

    store: Any = checkpoint.filesystem  # always set: Ray infers it from the path when not given
    infos = store.get_file_info(pyarrow.fs.FileSelector(checkpoint.path))
    names = sorted(
        os.path.basename(info.path)
        for info in infos
        if os.path.basename(info.path).endswith(".ckpt") and not os.path.basename(info.path).startswith(".")
    )
    if len(names) != 1:
        msg = (
            f"The Ray checkpoint {checkpoint!r} holds {len(names)} phalanx checkpoints ({names or 'none'}); expected "
            "exactly one *.ckpt file or directory, as RayTrainReportCallback reports them. Fix: resume from a "
            "checkpoint reported by RayTrainReportCallback, or pass fit(ckpt_path=...) a phalanx checkpoint yourself."
        )
        raise CheckpointError(msg)
    if store.type_name == "local":
        return os.path.join(checkpoint.path, names[0])
    return os.path.join(checkpoint.to_directory(), names[0])


def latest_checkpoint() -> str | None:
    """The phalanx checkpoint of Ray Train's latest reported checkpoint, to resume from; None if none.

    Inside a Ray Train worker after Ray restarted the workers (``FailureConfig(max_failures=K)``)
    or resumed a run, this is the checkpoint to pass to ``trainer.fit(model, ckpt_path=...)``: the
    same one on every worker. Before the first report, and outside a Ray Train worker (so the same
    script also runs without Ray), it is None: ``fit`` then starts from scratch.
    """
    from phalanx_ray.environment import RayEnvironment

    if not RayEnvironment.detect():
        return None
    checkpoint = require_ray_train().get_checkpoint()
    return None if checkpoint is None else checkpoint_path(checkpoint)
