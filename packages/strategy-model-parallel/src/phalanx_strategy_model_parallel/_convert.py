"""``phalanx checkpoint convert``: a distributed model-parallel directory -> one portable torch file.

Runs in one process without a process group (DCP's ``no_dist`` mode): DCP's metadata gives every
model tensor's global shape and dtype, so full-size tensors are allocated and DCP fills them from
all ranks' shard files, whatever mesh wrote them (tensor-parallel slices, FSDP shards, pipeline
stages). Only the model is read; the portable format carries weights.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

__all__ = ["convert_distributed_checkpoint", "load_full_model_state"]


def load_full_model_state(source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The full model state dict and the Trainer state of a distributed checkpoint.

    Raises:
        CheckpointError: ``source`` is not a complete ModelParallelStrategy checkpoint.
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
    from phalanx_strategy_model_parallel._checkpoint import MODEL_KEY, read_meta, saved_shapes

    meta = read_meta(source, TorchCheckpointIO())
    reader = FileSystemReader(source)
    dtypes = {
        key[len(MODEL_KEY) + 1 :]: item.properties.dtype
        for key, item in reader.read_metadata().state_dict_metadata.items()
        if key.startswith(MODEL_KEY + ".") and hasattr(item, "properties")
    }
    tensors = {name: torch.empty(shape, dtype=dtypes[name]) for name, shape in saved_shapes(source).items()}
    state = {MODEL_KEY: tensors}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return state[MODEL_KEY], meta


def convert_distributed_checkpoint(source: str, destination: str) -> bool | None:
    """Write ``source`` as a portable file; ``None`` when it is not this strategy's directory format."""
    from phalanx_strategy_model_parallel._checkpoint import is_distributed_checkpoint

    if not (os.path.isdir(source) and is_distributed_checkpoint(source)):
        return None
    from phalanx.utilities import write_portable_checkpoint

    state_dict, meta = load_full_model_state(source)
    write_portable_checkpoint(state_dict, destination, source=source, extra=meta)
    return True
