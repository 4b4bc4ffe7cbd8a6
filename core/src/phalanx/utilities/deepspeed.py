"""``lightning.pytorch.utilities.deepspeed``: turn a DeepSpeed ZeRO checkpoint into one fp32 file.

A DeepSpeed checkpoint is a directory of per-rank shards; this writes the whole model's fp32
weights to a single file that ``Module.load_from_checkpoint`` (or ``torch.load`` plus
``load_state_dict``) reads without DeepSpeed. The work is the ``phalanx-strategy-deepspeed``
plugin's (the same conversion as ``phalanx checkpoint convert``): the core never imports DeepSpeed.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from phalanx.errors import MisconfigurationError

__all__ = ["CPU_DEVICE", "convert_zero_checkpoint_to_fp32_state_dict", "ds_checkpoint_dir"]

#: Where the converted weights are loaded.
CPU_DEVICE = torch.device("cpu")


def _latest_tag(checkpoint_dir: str) -> str | None:
    latest = os.path.join(checkpoint_dir, "latest")
    if not os.path.isfile(latest):
        return None
    with open(latest, encoding="utf-8") as handle:
        return handle.read().strip()


def ds_checkpoint_dir(checkpoint_dir: str | os.PathLike[str], tag: str | None = None) -> str:
    """The tag sub-directory of a DeepSpeed checkpoint holding the shards: ``tag``, else the one its
    ``latest`` file names.

    Raises:
        ValueError: No ``tag`` and no ``latest`` file.
        FileNotFoundError: The tag's directory does not exist.
    """
    root = os.fspath(checkpoint_dir)
    if tag is None:
        tag = _latest_tag(root)
        if tag is None:
            msg = f"{root!r} has no 'latest' file naming the checkpoint's tag; pass tag=... (e.g. 'checkpoint')"
            raise ValueError(msg)
    directory = os.path.join(root, tag)
    if not os.path.isdir(directory):
        msg = f"the DeepSpeed checkpoint tag directory {directory!r} does not exist"
        raise FileNotFoundError(msg)
    return directory


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str | os.PathLike[str], output_file: str | os.PathLike[str], tag: str | None = None
) -> dict[str, Any]:
    """Consolidate the DeepSpeed checkpoint ``checkpoint_dir`` into ``output_file`` and return its contents.

    The file holds ``state_dict`` (fp32, the Module's parameter names) and the Trainer's state
    (``epoch``, ``global_step``, hyperparameters), so ``Module.load_from_checkpoint(output_file)`` works.

    Args:
        checkpoint_dir: The checkpoint directory (the one holding ``latest``).
        output_file: Where to write the consolidated file.
        tag: The tag to convert; only the one ``latest`` names is supported (the others are older
            saves DeepSpeed kept).

    Raises:
        MisconfigurationError: ``tag`` is not the latest one, or no installed plugin recognises the
            directory (``pip install phalanx-strategy-deepspeed``).
    """
    from phalanx.discovery import convert_checkpoint

    source = os.fspath(checkpoint_dir)
    if tag is not None:
        ds_checkpoint_dir(source, tag)  # the tag must exist
        latest = _latest_tag(source)
        if latest is not None and tag != latest:
            msg = (
                f"convert_zero_checkpoint_to_fp32_state_dict(tag={tag!r}): phalanx converts the tag 'latest' names "
                f"({latest!r}). Fix: pass tag=None, or write {tag!r} into {os.path.join(source, 'latest')}."
            )
            raise MisconfigurationError(msg)
    destination = os.fspath(output_file)
    convert_checkpoint(source, destination)
    checkpoint: dict[str, Any] = torch.load(destination, map_location=CPU_DEVICE, weights_only=False)
    return checkpoint
