"""Where phalanx writes: local (or mounted) paths, and one clear error for a URL it cannot write to.

Handed to ``os.path`` and ``open``, ``"s3://bucket/run"`` is a relative path: the checkpoints of a
run pointed at a bucket would land in a local folder named ``s3:`` and a resume would "work" from
that copy while the bucket stays empty. Until checkpoints and logs are written through fsspec,
every place that writes (``default_root_dir``, ``ModelCheckpoint(dirpath=)``, the loggers'
``save_dir``, ``fit(ckpt_path=)``, ``save_checkpoint``) refuses such a URL when it is given, with the
ways that work. ``file://`` URLs are local paths. Reading a single checkpoint file from a URL
(``Module.load_from_checkpoint("s3://...")``) already goes through fsspec.
"""

from __future__ import annotations

import os
import re
from typing import Any

from phalanx.errors import MisconfigurationError

__all__ = ["local_path", "url_scheme"]

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def url_scheme(value: Any) -> str | None:
    """The scheme of a URL (``"s3"`` for ``"s3://b/k"``), or None for a plain path."""
    found = _URL.match(os.fspath(value)) if isinstance(value, (str, os.PathLike)) else None
    return found.group(1).lower() if found else None


def local_path(value: str | os.PathLike[str], *, argument: str) -> str:
    """``value`` as a local path; ``file://`` is stripped.

    Args:
        value: The path the user passed.
        argument: How the user passed it, for the message (``"Trainer(default_root_dir=...)"``).

    Raises:
        MisconfigurationError: A URL of any other scheme (``s3://``, ``gs://``, ``hdfs://``...).
    """
    text = os.fspath(value)
    scheme = url_scheme(text)
    if scheme is None:
        return text
    if scheme == "file":
        return text[len("file://") :]
    msg = (
        f"{argument} got {text!r}, a {scheme}:// URL; phalanx writes checkpoints and logs to local or mounted "
        f"paths only (as a path, the URL would become a local folder named '{scheme}:'). Valid: a local path, a "
        f"file system mounted at a path (the bucket through mountpoint-s3, s3fs-fuse or gcsfuse; NFS; Lustre), or "
        f"file://. Fix: mount the bucket and pass its mount point, e.g. '/mnt/{scheme}-bucket/run', or write locally "
        "and copy the files to the store after the run."
    )
    raise MisconfigurationError(msg)
