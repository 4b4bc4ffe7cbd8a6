"""Checks a checkpoint must pass before it is loaded into a run: one wording for every strategy.

Public for plugin packages: a strategy that restores weights, optimizer states or schedulers its
own way (sharded, consolidated, an engine's) finds and names a mismatch as the core does
(:func:`compare_state_dicts`, :func:`check_optimizer_count`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx.errors import CheckpointError

__all__ = [
    "StateDictDifferences",
    "check_optimizer_count",
    "check_scheduler_count",
    "compare_state_dicts",
    "shapes",
]


def _where(source: object | None) -> str:
    return f"The checkpoint {source!r}" if source is not None else "The checkpoint"


def check_optimizer_count(saved: int, created: int, *, source: object | None = None) -> None:
    """Refuse a checkpoint holding ``saved`` optimizer states for a run whose ``configure_optimizers``
    created ``created`` optimizers.

    Raises:
        CheckpointError: The two numbers differ (the message names the fix).
    """
    _check_count("optimizer", "resume with the optimizers", saved, created, source)


def check_scheduler_count(saved: int, created: int, *, source: object | None = None) -> None:
    """Refuse a checkpoint holding ``saved`` LR scheduler states for ``created`` configured schedulers.

    Raises:
        CheckpointError: The two numbers differ (the message names the fix).
    """
    _check_count("LR scheduler", "return the schedulers", saved, created, source)


def _check_count(what: str, fix: str, saved: int, created: int, source: object | None) -> None:
    if saved != created:
        msg = (
            f"{_where(source)} holds {saved} {what} state(s) but configure_optimizers created {created}. "
            f"Fix: {fix} the checkpoint was trained with."
        )
        raise CheckpointError(msg)


@dataclass(frozen=True)
class StateDictDifferences:
    """How a checkpoint's model state differs from a model's: names on one side only, and names
    whose shapes differ (``"name: checkpoint (9, 6) vs model (4, 6)"``)."""

    missing: list[str] = field(default_factory=list)  #: in the model, not in the checkpoint
    unexpected: list[str] = field(default_factory=list)  #: in the checkpoint, not in the model
    reshaped: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.reshaped)

    def describe(self, shown: int = 5) -> str:
        """``missing keys [...]; unexpected keys [...]; shape mismatch [...]``, the first ``shown`` of each."""
        parts = []
        for label, items in (("missing keys", self.missing), ("unexpected keys", self.unexpected),
                             ("shape mismatch", self.reshaped)):  # fmt: skip
            if items:
                more = f" (+{len(items) - shown} more)" if len(items) > shown else ""
                parts.append(f"{label} {items[:shown]}{more}")
        return "; ".join(parts)


def shapes(state: Mapping[str, Any]) -> dict[str, tuple[int, ...] | None]:
    """Name -> shape of each entry of a state dict (``None`` for an entry that is not a tensor)."""
    return {name: tuple(value.shape) if hasattr(value, "shape") else None for name, value in state.items()}


def compare_state_dicts(
    model: Mapping[str, tuple[int, ...] | None],
    checkpoint: Mapping[str, tuple[int, ...] | None],
    *,
    names: bool = True,
    unexpected: bool = True,
) -> StateDictDifferences:
    """Compare a model's state (name -> shape, see :func:`shapes`) with a checkpoint's.

    Args:
        model: The model's names and shapes, in the model's order.
        checkpoint: The checkpoint's names and shapes.
        names: Whether names on one side only count (strict loading); shapes always do.
        unexpected: Whether checkpoint names the model lacks count (False where this rank holds part
            of the model: a pipeline stage).
    """
    return StateDictDifferences(
        missing=[name for name in model if name not in checkpoint] if names else [],
        unexpected=[name for name in checkpoint if name not in model] if names and unexpected else [],
        reshaped=[
            f"{name}: checkpoint {tuple(checkpoint[name] or ())} vs model {model[name]}"
            for name in model
            if name in checkpoint
            and checkpoint[name] is not None
            and model[name] is not None
            and tuple(checkpoint[name] or ()) != model[name]
        ],
    )
