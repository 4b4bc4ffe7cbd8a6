"""Turn a model built on the meta device into real, sharded tensors, one shard per rank.

``configure_model`` under ``model_sharded_context`` creates layers on the meta device: shapes and
dtypes without storage. After ``fully_shard`` has replaced each parameter by a meta DTensor that
describes only this rank's shard, ``to_empty`` allocates exactly that shard and each module's
``reset_parameters`` initialises it in place. No rank ever holds the full model, which is what lets
a model larger than one rank's memory be built at all.
"""

from __future__ import annotations

import torch
from torch import nn

from phalanx.errors import MisconfigurationError

__all__ = ["has_meta_tensors", "materialize_meta_module", "modules_needing_init"]


def _direct_tensors(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(recurse=False), *module.buffers(recurse=False)]


def has_meta_tensors(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` lives on the meta device."""
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def modules_needing_init(model: nn.Module) -> list[nn.Module]:
    """Modules that directly own meta tensors; each must be able to re-initialise them.

    Collected *before* ``to_empty`` (afterwards nothing is meta any more) and checked early, so a
    model that cannot be initialised fails before any memory is allocated.

    Raises:
        MisconfigurationError: A module owns meta tensors but has no ``reset_parameters``.
    """
    found = [m for m in model.modules() if any(t.is_meta for t in _direct_tensors(m))]
    missing = sorted({type(m).__name__ for m in found if not callable(getattr(m, "reset_parameters", None))})
    if missing:
        msg = (
            f"configure_model created {missing} on the meta device (sharded init), but these modules have "
            "no reset_parameters() to initialise their weights once their shards are allocated. Fix: define "
            "reset_parameters(self) on them (initialising every parameter and buffer they own), or create "
            "the model in __init__ instead of configure_model."
        )
        raise MisconfigurationError(msg)
    return found


def materialize_meta_module(model: nn.Module, modules: list[nn.Module], device: torch.device) -> None:
    """Allocate this rank's shards on ``device`` and initialise them with ``reset_parameters``."""
    model.to_empty(device=device)
    with torch.no_grad():
        for module in modules:
            module.reset_parameters()  # type: ignore[operator]
