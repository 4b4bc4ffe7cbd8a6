"""Checks a checkpoint must pass before it is loaded into a run: one wording for every strategy.

Public for plugin packages: a strategy that restores optimizer states or schedulers its own way
(sharded, consolidated, an engine's) refuses a mismatch with the same message as the core's.
"""

from __future__ import annotations

from phalanx.errors import CheckpointError

__all__ = ["check_optimizer_count", "check_scheduler_count"]


def _where(source: object | None) -> str:
    return f"The checkpoint {source!r}" if source is not None else "The checkpoint"


def check_optimizer_count(saved: int, created: int, *, source: object | None = None) -> None:
    """Refuse a checkpoint holding ``saved`` optimizer states for a run whose ``configure_optimizers``
    created ``created`` optimizers.

    Raises:
        CheckpointError: The two numbers differ (the message names the fix).
    """
    if saved != created:
        msg = (
            f"{_where(source)} holds {saved} optimizer state(s) but configure_optimizers created {created}. "
            "Fix: resume with the optimizers the checkpoint was trained with."
        )
        raise CheckpointError(msg)


def check_scheduler_count(saved: int, created: int, *, source: object | None = None) -> None:
    """Refuse a checkpoint holding ``saved`` LR scheduler states for ``created`` configured schedulers.

    Raises:
        CheckpointError: The two numbers differ (the message names the fix).
    """
    if saved != created:
        msg = (
            f"{_where(source)} holds {saved} LR scheduler state(s) but configure_optimizers created {created}. "
            "Fix: return the schedulers the checkpoint was trained with."
        )
        raise CheckpointError(msg)
