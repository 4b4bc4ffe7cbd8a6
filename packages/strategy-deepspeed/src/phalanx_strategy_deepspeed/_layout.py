"""What a phalanx DeepSpeed checkpoint directory looks like, readable without torch or deepspeed.

DeepSpeed writes a checkpoint as a directory: ``latest`` (the tag), ``<tag>/`` with one model-states
file and one optimizer-state shard per rank, and ``zero_to_fp32.py``. phalanx adds a small JSON
manifest beside them recording the world size, the ZeRO stage and the model's parameter names and
shapes. The manifest lets resume fail early, with a message naming the mismatch, instead of deep
inside DeepSpeed's loader, and lets ``phalanx checkpoint convert`` recognise the format from the
directory listing alone (it runs without importing torch for formats that are not ours).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from phalanx.checkpoint_io.checks import compare_state_dicts
from phalanx.errors import CheckpointError

__all__ = [
    "MANIFEST_NAME",
    "TAG",
    "CheckpointManifest",
    "compare_parameters",
    "is_deepspeed_checkpoint",
    "read_manifest",
    "write_manifest",
]

#: File written beside DeepSpeed's files; its presence marks a phalanx DeepSpeed checkpoint.
MANIFEST_NAME = "phalanx_deepspeed.json"
#: The tag (sub-directory) the engine saves under, as Lightning does.
TAG = "checkpoint"
_FORMAT = "phalanx-deepspeed"
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class CheckpointManifest:
    """Facts about a saved run needed to judge whether it can be resumed here.

    Attributes:
        world_size: Number of ranks that wrote the shards (ZeRO shards are per rank).
        zero_stage: The ZeRO stage of the run (0-3).
        tag: Sub-directory DeepSpeed saved into.
        parameters: Full (unpartitioned) shape of every parameter, by state-dict name.
        phalanx_version: Version of phalanx that wrote it, for diagnostics.
    """

    world_size: int
    zero_stage: int
    tag: str = TAG
    parameters: dict[str, list[int]] = field(default_factory=dict)
    phalanx_version: str = ""


def is_deepspeed_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a DeepSpeed checkpoint directory (ours or one DeepSpeed wrote directly)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, MANIFEST_NAME)) or os.path.isfile(os.path.join(path, "latest")):
        return True
    return any(_has_model_states(os.path.join(path, entry)) for entry in _listdir(path))


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _has_model_states(directory: str) -> bool:
    return os.path.isdir(directory) and any(name.endswith("model_states.pt") for name in _listdir(directory))


def write_manifest(path: str | os.PathLike[str], manifest: CheckpointManifest) -> None:
    """Write the manifest atomically (a crash leaves the previous one, never half a file)."""
    target = os.path.join(os.fspath(path), MANIFEST_NAME)
    tmp = f"{target}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"format": _FORMAT, "format_version": _FORMAT_VERSION, **asdict(manifest)}, handle, indent=1)
    os.replace(tmp, target)


def read_manifest(path: str | os.PathLike[str]) -> CheckpointManifest | None:
    """The manifest of a checkpoint directory, or None when DeepSpeed wrote it without phalanx.

    Raises:
        CheckpointError: ``path`` is not a directory, or the manifest is unreadable.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        kind = "a file" if os.path.isfile(path) else "missing"
        msg = (
            f"DeepSpeed checkpoint {path!r} is {kind}; DeepSpeedStrategy saves checkpoints as directories. "
            "Pass the directory Trainer.save_checkpoint wrote, or convert a directory to one file with "
            "`phalanx checkpoint convert SRC DST`."
        )
        raise CheckpointError(msg)
    target = os.path.join(path, MANIFEST_NAME)
    if not os.path.isfile(target):
        return None
    try:
        with open(target, encoding="utf-8") as handle:
            data: dict[str, Any] = json.load(handle)
    except (OSError, ValueError) as error:
        msg = f"The phalanx manifest {target!r} cannot be read ({error}); the checkpoint is damaged. Save it again."
        raise CheckpointError(msg) from error
    if data.get("format") != _FORMAT:
        msg = f"{target!r} has format={data.get('format')!r}, expected {_FORMAT!r}; it was not written by phalanx."
        raise CheckpointError(msg)
    fields = ("world_size", "zero_stage", "tag", "parameters", "phalanx_version")
    return CheckpointManifest(**{key: data[key] for key in fields if key in data})


def compare_parameters(saved: dict[str, list[int]], current: dict[str, list[int]]) -> str | None:
    """Describe how two parameter tables differ (missing, unexpected, reshaped), or None if equal
    (the core's comparison and wording: ``phalanx.checkpoint_io.checks``)."""
    differences = compare_state_dicts(
        {name: tuple(shape) for name, shape in current.items()}, {name: tuple(shape) for name, shape in saved.items()}
    )
    return differences.describe() if differences else None
