"""Where checkpoints live: local paths and fsspec URLs (``s3://``, ``gs://``, ``memory://``...).

One place decides whether a path is remote and which fsspec file system serves it, so every
writer and reader (single files, DCP directories, DeepSpeed's staged uploads, the loggers, "last")
agrees. Local paths keep going through ``os`` (rename, fsync and nanosecond mtimes are what local
atomicity and ordering rely on); every other scheme goes through fsspec. The helpers that need no
torch live in :mod:`phalanx.utilities.paths` (the loggers import them without importing torch);
this module is their name for checkpoint code.

Options for a store (endpoint, region, credentials) come from the backend's own configuration
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``...) and from fsspec's
configuration (``fsspec.config.conf``, ``FSSPEC_<PROTOCOL>_<OPTION>`` environment variables), which
every process of a run reads alike; phalanx adds none of its own.
"""

from __future__ import annotations

from typing import Any

from phalanx.utilities.paths import (
    check_filesystem,
    filesystem,
    is_remote,
    join,
    parent_and_name,
    remote_error,
    url_scheme,
)

__all__ = [
    "check_filesystem",
    "filesystem",
    "is_remote",
    "join",
    "modified",
    "parent_and_name",
    "remote_error",
    "url_scheme",
]


def modified(fs: Any, path: str) -> float:
    """Last-modified time of ``path`` on ``fs`` in seconds (0.0 where the store reports none)."""
    try:
        stamp = fs.modified(path)
    except (NotImplementedError, FileNotFoundError, OSError, KeyError):
        info = fs.info(path)
        stamp = info.get("LastModified") or info.get("mtime") or info.get("created") or info.get("updated")
    if stamp is None:
        return 0.0
    if isinstance(stamp, (int, float)):
        return float(stamp)
    if isinstance(stamp, str):
        from datetime import datetime

        stamp = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        from datetime import timezone

        stamp = stamp.replace(tzinfo=timezone.utc)
    return float(stamp.timestamp())
