"""Conversion of a plain torch checkpoint file (single_device, ddp) into the portable format."""

from __future__ import annotations

import os

__all__ = ["convert_torch_file"]


def convert_torch_file(source: str, destination: str) -> bool | None:
    """Convert a checkpoint file holding ``"state_dict"``; pass (``None``) on anything else."""
    if not os.path.isfile(source):
        return None
    # Imported after the check: a directory (another plugin's sharded format) passes without torch.
    from phalanx.checkpoint_io.portable import write_portable_checkpoint
    from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
    from phalanx.errors import CheckpointError

    checkpoint = TorchCheckpointIO().load_checkpoint(source, map_location="cpu")
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        msg = f"{source!r} is a torch file but not a phalanx checkpoint (no 'state_dict' key); pass a file written by Trainer.save_checkpoint"
        raise CheckpointError(msg)
    write_portable_checkpoint(checkpoint["state_dict"], destination, source=source, extra=checkpoint)
    return True
