"""The portable checkpoint: one torch file any strategy's checkpoint can be converted into.

``phalanx checkpoint convert`` turns a checkpoint of any strategy (a plain file, DDP's, FSDP's
shards, a DeepSpeed or model-parallel directory) into the same single file, which
``single_device`` loads and plain PyTorch reads with ``torch.load(weights_only=True)``. Each
strategy package gathers its own layout into one full state dict and then writes it here, so
every converter produces byte-for-byte the same format; that is why the writer is public.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
from phalanx.version import __version__

__all__ = ["PORTABLE_KEYS", "write_portable_checkpoint"]

#: Keys of the source checkpoint carried over into a portable one when present: where training
#: stood, and what ``Module.load_from_checkpoint`` needs to rebuild the model (its class, for
#: messages, and the saved ``__init__`` arguments of the Module and the DataModule).
PORTABLE_KEYS = (
    "epoch",
    "global_step",
    "strategy",
    "world_size",
    "module_class",
    "hyper_parameters",
    "hparams_name",
    "datamodule_hyper_parameters",
    "datamodule_hparams_name",
)


def write_portable_checkpoint(
    state_dict: dict[str, Any],
    destination: str,
    *,
    source: str,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write ``state_dict`` atomically to ``destination`` as a portable checkpoint.

    Floating-point tensors are stored as float32 on CPU whatever precision trained them, so the
    file loads on any machine into a float32 model; other tensors keep their dtype.

    Args:
        state_dict: The full (gathered, unsharded) ``module.state_dict()``.
        destination: The file to write; missing parent folders are created.
        source: The checkpoint it was converted from; its base name is recorded for diagnostics.
        extra: The source's checkpoint entries other than the weights (pass them all); only
            :data:`PORTABLE_KEYS` are carried over, since optimizer and loop state belong to the
            strategy that wrote them.
    """
    full = {
        key: (value.detach().to("cpu", torch.float32) if value.is_floating_point() else value.detach().cpu())
        if isinstance(value, torch.Tensor)
        else value
        for key, value in state_dict.items()
    }
    checkpoint: dict[str, Any] = {
        "state_dict": full,
        "phalanx_version": __version__,
        "converted_from": os.path.basename(source),
    }
    for key, value in (extra or {}).items():
        if key in PORTABLE_KEYS:
            checkpoint[key] = value
    TorchCheckpointIO().save_checkpoint(checkpoint, destination)
