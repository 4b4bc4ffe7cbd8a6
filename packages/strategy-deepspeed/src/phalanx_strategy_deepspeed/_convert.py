"""Consolidate a DeepSpeed checkpoint directory into full fp32 weights (``phalanx checkpoint convert``).

ZeRO stages 1-3 keep the authoritative fp32 weights inside the per-rank optimizer shards (the
model-states file may hold only 16-bit or partitioned copies), so consolidation goes through
DeepSpeed's own zero-to-fp32 code, which re-assembles them. Stage 0 (no ZeRO) checkpoints have the
full weights in the model-states file and are read directly. Runs on CPU in a single process.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from phalanx.errors import CheckpointError

__all__ = ["consolidate", "convert_deepspeed_checkpoint"]


def _tag_dir(path: str) -> str:
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest, encoding="utf-8") as handle:
            return os.path.join(path, handle.read().strip())
    candidates = sorted({os.path.dirname(f) for f in glob.glob(os.path.join(path, "*", "*model_states.pt"))})
    if len(candidates) != 1:
        msg = (
            f"{path!r} has no 'latest' file and {len(candidates)} tag directories with model states; DeepSpeed "
            "cannot tell which one to use. Fix: write the tag name into a 'latest' file there."
        )
        raise CheckpointError(msg)
    return candidates[0]


def _has_zero_shards(tag_dir: str) -> bool:
    return bool(glob.glob(os.path.join(tag_dir, "*optim_states.pt")))


def consolidate(path: str) -> dict[str, Any]:
    """The full fp32 state dict (CPU tensors, ``module.state_dict()`` keys) of a checkpoint directory.

    Raises:
        CheckpointError: The directory is damaged or not a DeepSpeed checkpoint.
    """
    import torch

    tag_dir = _tag_dir(path)
    try:
        if _has_zero_shards(tag_dir):
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            state = get_fp32_state_dict_from_zero_checkpoint(path, tag=os.path.basename(tag_dir))
        else:
            files = sorted(glob.glob(os.path.join(tag_dir, "*model_states.pt")))
            if not files:
                msg = f"{tag_dir!r} holds no model states file; the DeepSpeed checkpoint is incomplete. Save it again."
                raise CheckpointError(msg)
            # DeepSpeed's own files carry non-tensor metadata (its config, versions): they are read
            # the way DeepSpeed reads them. Only convert checkpoints you trust.
            state = torch.load(files[0], map_location="cpu", weights_only=False)["module"]
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, AssertionError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        msg = f"Cannot consolidate the DeepSpeed checkpoint {path!r}: {first}. It is damaged or incomplete; save it again."
        raise CheckpointError(msg) from error
    return {name: tensor.detach().to("cpu", torch.float32) if tensor.is_floating_point() else tensor for name, tensor in state.items()}


def convert_deepspeed_checkpoint(source: str, destination: str) -> None:
    """Write the consolidated fp32 weights of ``source`` (a directory) as one portable file.

    The Trainer's epoch and global step are carried over when phalanx wrote the directory.
    """
    from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
    from phalanx.utilities import write_portable_checkpoint as write_portable
    from phalanx_strategy_deepspeed._checkpoint import TRAINER_STATE
    from phalanx_strategy_deepspeed._layout import read_manifest

    state_dict = consolidate(source)
    extra: dict[str, Any] = {"strategy": "deepspeed"}
    state_file = os.path.join(source, TRAINER_STATE)
    if os.path.isfile(state_file):
        extra.update(TorchCheckpointIO().load_checkpoint(state_file, map_location="cpu"))
    manifest = read_manifest(source)
    if manifest is not None:
        extra["world_size"] = manifest.world_size
    write_portable(state_dict, destination, source=source, extra=extra)
