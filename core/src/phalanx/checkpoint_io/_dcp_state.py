"""Applying and checking sharded state: the parts of :mod:`phalanx.checkpoint_io.dcp` that read no files.

Kept apart so that the format module stays about saving and reading; every name here is
re-exported (and documented) by :mod:`phalanx.checkpoint_io.dcp`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from phalanx.checkpoint_io.checks import compare_state_dicts, shapes
from phalanx.errors import CheckpointError

__all__ = [
    "apply_model_state",
    "apply_optimizer_states",
    "check_model_matches",
    "load_optimizer_hyperparameters",
    "require_entry",
]

_SHOWN = 5


def _model_name(model: nn.Module) -> str:
    """The user's class name: FSDP2 and friends swap a module's class for a generated subclass."""
    for cls in type(model).__mro__:
        if not cls.__module__.startswith("torch.distributed"):
            return cls.__qualname__
    return type(model).__qualname__


def check_model_matches(
    model: nn.Module,
    saved: Mapping[str, tuple[int, ...] | None],
    *,
    source: str,
    strict: bool,
    partial: bool = False,
) -> None:
    """Refuse a checkpoint of another model before any collective load, naming what differs.

    Args:
        model: The (possibly sharded) model; DTensor shapes are global shapes.
        saved: Name -> shape (``None`` for non-tensor entries) of the checkpoint's model state.
        source: The checkpoint, for the message.
        strict: Whether missing or unexpected names are errors (a shape mismatch always is).
        partial: This rank holds only part of the model (pipeline stages), so checkpoint entries
            it does not hold are expected.

    Raises:
        CheckpointError: Listing the first differing names and shapes, and the fix.
    """
    differences = compare_state_dicts(
        shapes(get_model_state_dict(model)), saved, names=strict, unexpected=not partial
    )
    if not differences:
        return
    msg = (
        f"The checkpoint {source!r} does not fit the model {_model_name(model)}: {differences.describe(_SHOWN)}. "
        "It was written "
        "for another model. Fix: pass the checkpoint of this model (any world size or mesh shape loads), build the "
        "model the checkpoint was trained with, or set strict_loading = False for name differences."
    )
    raise CheckpointError(msg)


def require_entry(checkpoint: Mapping[str, Any], key: str, what: str) -> None:
    """Refuse a checkpoint without ``key`` (e.g. a weights-only file given to resume training).

    Raises:
        CheckpointError: Naming the keys it has and what to pass instead.
    """
    if key not in checkpoint:
        msg = (
            f"The checkpoint has no {key!r} entry (keys: {sorted(checkpoint)}), so it holds no {what}. Fix: pass a "
            "checkpoint written by Trainer.save_checkpoint (a full one to resume training)."
        )
        raise CheckpointError(msg)


def apply_model_state(model: nn.Module, state_dict: Mapping[str, Any], *, strict: bool = True) -> None:
    """Load a sharded model state from :func:`read` into ``model`` (collective)."""
    set_model_state_dict(model, dict(state_dict), options=StateDictOptions(strict=strict))


def apply_optimizer_states(model: nn.Module, optimizers: list[Optimizer], states: list[dict[str, Any]]) -> None:
    """Load sharded optimizer states from :func:`read` (collective)."""
    for optimizer, state in zip(optimizers, states):
        if not state.get("state"):
            load_optimizer_hyperparameters(optimizer, state)
        else:
            set_optimizer_state_dict(model, optimizer, state)


def load_optimizer_hyperparameters(optimizer: Optimizer, state: Mapping[str, Any]) -> None:
    """Restore only the param groups' settings (lr, momentum, ...) of a state with no per-parameter entries.

    An optimizer that keeps no per-parameter state (plain SGD) saves an empty ``"state"``; torch's
    ``set_optimizer_state_dict`` cannot place such a state on a device and raises, although there is
    nothing to place. Groups are matched by position, as ``Optimizer.load_state_dict`` does.

    Raises:
        CheckpointError: Another number of parameter groups.
    """
    saved = state.get("param_groups", [])
    if len(saved) != len(optimizer.param_groups):
        msg = (
            f"The checkpoint's optimizer has {len(saved)} parameter group(s) but configure_optimizers created "
            f"{len(optimizer.param_groups)}. Fix: resume with the optimizer the checkpoint was trained with."
        )
        raise CheckpointError(msg)
    for group, saved_group in zip(optimizer.param_groups, saved):
        group.update({key: value for key, value in saved_group.items() if key != "params"})
