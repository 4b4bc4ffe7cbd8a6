"""The core's own checkpoint formats, converted into the portable file.

Two formats belong to the core: a plain torch checkpoint file (single_device, ddp, FSDP "full")
and the sharded DCP directory that every sharded strategy writes through
:mod:`phalanx.checkpoint_io.dcp` (fsdp, model_parallel, a vendor's). Both are recognised from
the path alone, so other plugins' formats pass through here without importing torch.
"""

from __future__ import annotations

import os

__all__ = ["convert_torch_file"]


def convert_torch_file(source: str, destination: str) -> bool | None:
    """Convert a checkpoint file holding ``"state_dict"`` or a phalanx sharded directory; pass (``None``) on anything else."""
    if os.path.isdir(source) or "://" in source:
        return _convert_sharded(source, destination)
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


def _convert_sharded(source: str, destination: str) -> bool | None:
    """The core's DCP directory format (local or an fsspec URL); ``None`` for any other directory."""
    from phalanx.checkpoint_io._dcp_format import is_dcp_checkpoint

    if not is_dcp_checkpoint(source):
        return None
    from phalanx.checkpoint_io.dcp import convert_to_portable

    return convert_to_portable(source, destination)
