"""Is a path on a filesystem every process of the job sees? (Lightning's ``is_shared_filesystem``.)

Writing a checkpoint once from rank 0 is right on a shared filesystem and loses data on per-node
local disks; this asks the processes instead of guessing from the path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

__all__ = ["is_shared_filesystem"]


def is_shared_filesystem(strategy: Any, path: str | os.PathLike[str] | None = None, timeout: int = 3) -> bool:
    """Whether ``path`` (default: the working directory) is the same directory for every process.

    A URL of a remote filesystem (``s3://...``) counts as shared; one process is trivially shared.
    Otherwise rank 0 creates a marker file there and every rank looks for it for up to ``timeout``
    seconds; the answer is True only if all of them saw it. Call it on every rank (it runs
    collectives).

    Args:
        strategy: The strategy of the run (``trainer.strategy``).
        path: The directory (or a file in it) to check; it must exist and be writable.
        timeout: Seconds a rank waits for rank 0's marker to appear.

    Raises:
        FileNotFoundError: ``path`` does not exist on some rank.
    """
    if path is not None and "://" in os.fspath(path) and not os.fspath(path).startswith("file://"):
        return True
    resolved = Path(Path.cwd() if path is None else os.fspath(path).removeprefix("file://")).resolve()
    if getattr(strategy, "world_size", 1) == 1:
        return True
    if not strategy.reduce_boolean_decision(strategy.broadcast(resolved) == resolved, all=True):
        return False
    if not strategy.reduce_boolean_decision(resolved.exists(), all=True):
        msg = f"is_shared_filesystem: {resolved} does not exist on every rank; create it first (or pass another path)"
        raise FileNotFoundError(msg)
    directory = resolved.parent if resolved.is_file() else resolved
    marker = directory / ".phalanx_shared_fs_check"
    marker.unlink(missing_ok=True)
    strategy.barrier()
    if strategy.is_global_zero:
        marker.touch()
        found = True
    else:
        deadline = time.perf_counter() + timeout
        found = marker.exists()
        while not found and time.perf_counter() < deadline:
            time.sleep(0.01)
            found = marker.exists()
    strategy.barrier()
    shared = bool(strategy.reduce_boolean_decision(found, all=True))
    if strategy.is_global_zero:
        marker.unlink(missing_ok=True)
    strategy.barrier()
    return shared
