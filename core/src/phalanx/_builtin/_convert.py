"""Conversion of a plain torch checkpoint file (single_device, ddp) into the portable format."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["PORTABLE_KEYS", "convert_torch_file", "write_portable"]

#: Trainer-state keys carried over into a portable checkpoint when present.
PORTABLE_KEYS = ("epoch", "global_step", "strategy", "world_size")


def write_portable(state_dict: dict[str, Any], destination: str, *, source: str, extra: dict[str, Any] | None = None) -> None:
    """Write ``state_dict`` (floating tensors as fp32, on CPU) atomically as a portable checkpoint."""
    import torch

    from phalanx import __version__
    from phalanx.checkpoint_io.torch_io import TorchCheckpointIO

    full = {
        key: (value.detach().to("cpu", torch.float32) if value.is_floating_point() else value.detach().cpu())
        if isinstance(value, torch.Tensor)
        else value
        for key, value in state_dict.items()
    }
    checkpoint: dict[str, Any] = {"state_dict": full, "phalanx_version": __version__, "converted_from": os.path.basename(source)}
    for key, value in (extra or {}).items():
        if key in PORTABLE_KEYS:
            checkpoint[key] = value
    TorchCheckpointIO().save_checkpoint(checkpoint, destination)


def convert_torch_file(source: str, destination: str) -> bool | None:
    """Convert a checkpoint file holding ``"state_dict"``; pass (``None``) on anything else."""
    if not os.path.isfile(source):
        return None
    from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
    from phalanx.errors import CheckpointError

    checkpoint = TorchCheckpointIO().load_checkpoint(source, map_location="cpu")
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        msg = f"{source!r} is a torch file but not a phalanx checkpoint (no 'state_dict' key); pass a file written by Trainer.save_checkpoint"
        raise CheckpointError(msg)
    write_portable(checkpoint["state_dict"], destination, source=source, extra=checkpoint)
    return True
