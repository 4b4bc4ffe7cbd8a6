"""The names of the sharded (DCP) checkpoint format, and how to recognise one without torch.

Kept apart from :mod:`phalanx.checkpoint_io.dcp` because recognising a checkpoint must stay
cheap: ``phalanx checkpoint convert`` and ``load_from_checkpoint`` ask every installed format
whether a path is theirs, and only the one that answers yes may import torch.

A sharded checkpoint is a directory: DCP's ``.metadata`` (global shapes and shard offsets), one
``__<rank>_<n>.distcp`` file per writing rank, and :data:`META_FILE`, the Trainer's other state
(loops, callbacks, schedulers, precision) with the :data:`MARKER_KEY` entry naming the format.
Rank 0 writes the marker file before the directory is published, so a directory with ``.metadata``
but no marker file was written elsewhere or interrupted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from phalanx.checkpoint_io.storage import is_remote, join

__all__ = [
    "DCP_METADATA",
    "FORMAT",
    "LEGACY_META_FILES",
    "MARKER_KEY",
    "META_FILE",
    "MODEL_KEY",
    "OPTIMIZER_KEY",
    "format_marker",
    "has_dcp_metadata",
    "is_dcp_checkpoint",
    "meta_file",
]

#: DCP's own index of the shards; its presence makes a directory a DCP directory.
DCP_METADATA = ".metadata"
#: The Trainer state beside the shards (rank 0).
META_FILE = "meta.pt"
#: Marker files of checkpoints written before the format moved into the core (still readable).
LEGACY_META_FILES = ("trainer_state.pt",)
#: The entry of :data:`META_FILE` that names the format and how it was written.
MARKER_KEY = "dcp"
FORMAT = "phalanx-dcp"
#: Marker entries of the older, per-strategy copies of this format: ``{key: format name}``.
_LEGACY_MARKERS = {"fsdp": "phalanx-fsdp-sharded", "model_parallel": "phalanx-model-parallel-dcp"}
MODEL_KEY = "state_dict"
OPTIMIZER_KEY = "optimizer_states"


def _exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    from phalanx.checkpoint_io.storage import filesystem

    fs, inner = filesystem(path)
    return bool(fs.isfile(inner))


def has_dcp_metadata(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a DCP directory (``.metadata`` inside), phalanx's or anyone's."""
    return _exists(join(os.fspath(path), DCP_METADATA))


def meta_file(path: str | os.PathLike[str]) -> str | None:
    """The marker file of the checkpoint at ``path`` (current or legacy name), or None when it has none."""
    for name in (META_FILE, *LEGACY_META_FILES):
        candidate = join(os.fspath(path), name)
        if _exists(candidate):
            return candidate
    return None


def is_dcp_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a complete phalanx sharded checkpoint (DCP index plus marker file).

    Imports no torch, so that asking every installed format stays cheap.
    """
    return has_dcp_metadata(path) and meta_file(path) is not None


def format_marker(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The format entry of a loaded marker file (current or legacy), or None when it names none."""
    marker = meta.get(MARKER_KEY)
    if isinstance(marker, Mapping) and marker.get("format") == FORMAT:
        return dict(marker)
    for key, name in _LEGACY_MARKERS.items():
        legacy = meta.get(key)
        if isinstance(legacy, Mapping) and legacy.get("format") == name:
            return {**legacy, "format": FORMAT, "strategy": key}
    return None
