"""Materialising parameters a Module created on the meta device (sharded or not).

``configure_model`` may build layers under ``torch.device("meta")`` and parallelize them there, so
no rank ever holds the full model. After parallelizing, each rank allocates only its shards
(``to_empty``) and re-runs every submodule's ``reset_parameters`` on them. Initialisation then
draws random numbers per shard, so the weights are not bit-equal to a single-process init: load a
checkpoint when exact weights matter.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["has_meta_tensors", "materialize"]


def has_meta_tensors(module: nn.Module) -> bool:
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


def materialize(module: nn.Module, device: torch.device) -> None:
    """Allocate meta tensors on ``device`` and initialise them with each submodule's ``reset_parameters``.

    Raises:
        TypeError: A submodule with meta parameters has no ``reset_parameters`` (it could not be
            initialised); the message names it and the fix.
    """
    needs = [
        (name, sub)
        for name, sub in module.named_modules()
        if any(t.is_meta for t in (*sub.parameters(recurse=False), *sub.buffers(recurse=False)))
    ]
    module.to_empty(device=device, recurse=True)
    for name, sub in needs:
        reset = getattr(sub, "reset_parameters", None)
        if not callable(reset):
            msg = (
                f"{name or type(module).__name__} ({type(sub).__name__}) was created on the meta device but has no "
                "reset_parameters() to initialise it after sharding. Fix: define reset_parameters on it, or create "
                "it outside torch.device('meta') in configure_model."
            )
            raise TypeError(msg)
        with torch.no_grad():
            reset()
