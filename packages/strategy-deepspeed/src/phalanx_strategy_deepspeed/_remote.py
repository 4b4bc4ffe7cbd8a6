"""DeepSpeed checkpoints on a store: DeepSpeed reads and writes local files only, so stage them.

Saving: each rank's engine writes into a local temporary directory and :func:`upload` copies its
files under the target's staging prefix (rank 0 then commits it, ``phalanx.checkpoint_io.atomic``).
Loading: :func:`download` copies the committed directory into a local temporary directory.
"""

from __future__ import annotations

import os
import tempfile

from phalanx.checkpoint_io.atomic import committed_path
from phalanx.checkpoint_io.storage import filesystem, remote_error
from phalanx.errors import CheckpointError

__all__ = ["download", "upload"]


def download(url: str) -> str:
    """A local copy of the committed checkpoint at ``url`` (a file stays a URL: the IO reads it)."""
    try:
        complete = committed_path(url)
        if complete is None:
            msg = f"No complete DeepSpeed checkpoint at {url!r} (missing, or never committed); pass ckpt_path='last'."
            raise CheckpointError(msg)
        fs, inner = filesystem(complete)
        if fs.isfile(inner):
            return complete
        local = os.path.join(tempfile.mkdtemp(prefix="phalanx-deepspeed-"), "checkpoint")
        for source in fs.find(inner):
            destination = os.path.join(local, source[len(inner) :].lstrip("/"))
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            fs.get_file(source, destination)
    except CheckpointError:
        raise
    except Exception as error:  # the store's own errors (endpoint, credentials) vary by backend
        raise CheckpointError(remote_error(url, error, action="read the checkpoint", untouched=False)) from error
    return local


def upload(local: str, staging: str) -> None:
    """Upload every file under ``local`` to the same relative keys under the ``staging`` URL."""
    fs, inner = filesystem(staging)
    for folder, _, files in os.walk(local):
        for name in files:
            source = os.path.join(folder, name)
            relative = os.path.relpath(source, local).replace(os.sep, "/")
            fs.put_file(source, f"{inner}/{relative}")
