"""``phalanx checkpoint convert``: a sharded FSDP directory -> one portable torch file.

Runs in a single process without a process group (DCP's ``no_dist`` mode): DCP's metadata gives
every model tensor's global shape and dtype, so full-size tensors are allocated and DCP fills them
from all shard files. Only the model is read; optimizer shards are skipped, since the portable
format carries weights for single_device, ddp or inference.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

__all__ = ["convert_sharded_checkpoint", "load_full_model_state"]


def load_full_model_state(source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Assemble the full model state dict and the Trainer metadata of a sharded checkpoint.

    Raises:
        CheckpointError: ``source`` is not a complete FSDP sharded checkpoint.
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
    from phalanx_strategy_fsdp._checkpoint import MODEL_KEY, read_sharded_meta

    meta = read_sharded_meta(source, TorchCheckpointIO())
    reader = FileSystemReader(source)
    prefix = MODEL_KEY + "."
    tensors: dict[str, Any] = {}
    for key, item in reader.read_metadata().state_dict_metadata.items():
        if key.startswith(prefix) and isinstance(item, TensorStorageMetadata):
            tensors[key[len(prefix) :]] = torch.empty(tuple(item.size), dtype=item.properties.dtype)
    state = {MODEL_KEY: tensors}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state[MODEL_KEY], meta


def convert_sharded_checkpoint(source: str, destination: str) -> bool | None:
    """Write ``source`` (a sharded FSDP directory) as a portable file; ``None`` for other formats."""
    from phalanx_strategy_fsdp._checkpoint import META_FILE

    if not (os.path.isdir(source) and os.path.isfile(os.path.join(source, ".metadata"))):
        return None
    if not os.path.isfile(os.path.join(source, META_FILE)):
        return None  # a DCP directory from elsewhere: let another plugin (or the error path) answer
    from phalanx.utilities import write_portable_checkpoint as write_portable

    state_dict, meta = load_full_model_state(source)
    write_portable(state_dict, destination, source=source, extra=meta)
    return True
