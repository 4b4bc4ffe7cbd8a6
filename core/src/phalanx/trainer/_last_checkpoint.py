"""``ckpt_path="last"``: the newest complete checkpoint in the directories a Trainer uses.

Local directories are listed with ``os`` (nanosecond modification times); stores through fsspec,
where a directory counts only once committed (:mod:`phalanx.checkpoint_io.atomic`) and its time
is its commit marker's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.checkpoint_io.atomic import COMMIT_MARKER, is_staging_name
from phalanx.checkpoint_io.storage import filesystem, is_remote, join, modified

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["find_last_checkpoint"]


def _default_dirs(trainer: TrainerView) -> list[str]:
    dirs: list[str] = [cb.dirpath for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath]
    roots = {join(trainer.default_root_dir, "lightning_logs")}
    for logger in trainer.loggers:
        if logger.save_dir is not None and logger.name is not None:  # MLflow's name is None off rank 0
            roots.add(join(logger.save_dir, str(logger.name)))
    for root in sorted(roots):
        dirs.extend(join(version, "checkpoints") for version in sorted(_subdirectories(root)))
    dirs.append(join(trainer.default_root_dir, "checkpoints"))
    dirs.append(trainer.default_checkpoint_dir)
    return list(dict.fromkeys(dirs))  # without a logger the last two are the same directory


def _subdirectories(root: str) -> list[str]:
    """The directories directly under ``root`` (local or remote); none when it does not exist."""
    if not is_remote(root):
        path = Path(root)
        return [str(p) for p in path.iterdir() if p.is_dir()] if path.is_dir() else []
    fs, inner = filesystem(root)
    fs.invalidate_cache()
    prefix = root[: len(root) - len(inner)] if root.endswith(inner) else ""
    try:
        entries = fs.ls(inner, detail=True)
    except FileNotFoundError:
        return []
    return [prefix + entry["name"] for entry in entries if entry.get("type") == "directory"]


def _is_complete(path: Path) -> bool:
    """Whether ``path`` can be a finished checkpoint.

    Writers publish a checkpoint under its ``*.ckpt`` name only once it is complete (a file by
    rename, a sharded directory by :func:`phalanx.checkpoint_io.atomic.publish_directory`); what a
    killed writer leaves is a dot-named temporary or staging entry, skipped here, as are empty
    files and directories (nothing phalanx writes looks like that).
    """
    if path.name.startswith("."):
        return False
    try:
        if path.is_dir():
            return any(path.iterdir())
        return path.stat().st_size > 0
    except OSError:  # removed while we looked
        return False


def _local_candidates(directory: str) -> list[tuple[tuple[float, bool], str]]:
    path = Path(directory)
    if not path.is_dir():
        return []
    found = []
    for entry in path.glob("*.ckpt"):
        if _is_complete(entry):
            try:
                found.append(((float(entry.stat().st_mtime_ns), entry.name.startswith("last")), str(entry)))
            except OSError:  # removed while we looked
                continue
    return found


def _remote_candidates(directory: str) -> list[tuple[tuple[float, bool], str]]:
    """Committed checkpoints in a store: ``*.ckpt`` objects, and directories with their commit marker.

    A directory whose publish was interrupted counts through its committed staging prefix
    (:func:`phalanx.checkpoint_io.atomic.committed_path`). The time of a directory is its
    marker's: when it was committed.
    """
    fs, inner = filesystem(directory)
    fs.invalidate_cache()
    prefix = directory[: len(directory) - len(inner)] if directory.endswith(inner) else ""
    try:
        entries = fs.ls(inner, detail=True)
    except FileNotFoundError:
        return []
    found = []
    names = {entry["name"].rstrip("/").rpartition("/")[2] for entry in entries}
    for entry in entries:
        full = entry["name"].rstrip("/")
        name = full.rpartition("/")[2]
        target = name
        if is_staging_name(name) and name[1 : -len(".partial")].endswith(".ckpt"):
            target = name[1 : -len(".partial")]  # an interrupted publish of ``target``
        elif name.startswith(".") or not name.endswith(".ckpt"):
            continue
        elif entry.get("type") == "directory" and not fs.exists(f"{full}/{COMMIT_MARKER}"):
            continue  # not committed: being written, or a staging prefix holds it (below)
        if target != name and (target in names and fs.exists(f"{inner}/{target}/{COMMIT_MARKER}")):
            continue  # the target itself is complete
        if target != name and not fs.exists(f"{full}/{COMMIT_MARKER}"):
            continue  # a stale, uncommitted staging prefix
        if entry.get("type") == "directory":
            stamp = modified(fs, f"{full}/{COMMIT_MARKER}")
        elif entry.get("size", 1) == 0:
            continue
        else:
            stamp = modified(fs, full)
        found.append(((stamp, target.startswith("last")), prefix + full))
    return found


def _kept_by_scheduler(trainer: TrainerView) -> list[tuple[tuple[float, bool], str]]:
    """The checkpoint the cluster environment says its scheduler keeps for this run
    (:meth:`~phalanx.environments.cluster_environment.ClusterEnvironment.last_checkpoint`), if any.

    A local one is timed like the others; a remote one counts as the oldest candidate (a store's
    times do not compare with local ones), so it is chosen where nothing local exists: a restart
    on a node that never saw the run.
    """
    environment = getattr(trainer.strategy, "cluster_environment", None)  # parallel strategies have one
    kept = environment.last_checkpoint() if environment is not None else None
    if not kept:
        return []
    if is_remote(kept):
        return [((0.0, False), kept)]
    path = Path(kept)
    if not _is_complete(path):
        return []
    return [((float(path.stat().st_mtime_ns), False), kept)]


def find_last_checkpoint(trainer: TrainerView) -> str | None:
    """The most recently written complete ``*.ckpt`` in the checkpoint directories this Trainer uses,
    or the checkpoint the job's scheduler keeps for it (:func:`_kept_by_scheduler`) where that is newer.

    Remote directories count only once committed; on a store whose times have one-second
    resolution, ``last*`` wins a tie (it is written after the top-k file of the same save).
    """
    candidates = _kept_by_scheduler(trainer)
    for directory in _default_dirs(trainer):
        candidates.extend(_remote_candidates(directory) if is_remote(directory) else _local_candidates(directory))
    if not candidates:
        return None
    return max(candidates)[1]
