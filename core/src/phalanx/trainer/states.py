"""``lightning.pytorch.trainer.states``: what ``trainer.state`` holds.

``trainer.state.fn`` is the entry point being run (:class:`TrainerFn`), ``trainer.state.stage`` the
loop inside it (:class:`RunningStage`), ``trainer.state.status`` where the Trainer is in its life
(:class:`TrainerStatus`). The classes live in :mod:`phalanx.trainer_view` (torch-free, so callbacks
and loggers can import them cheaply); each is a case-insensitive ``str`` enum, so
``trainer.state.fn == "fit"`` holds.
"""

from __future__ import annotations

from phalanx.trainer_view import RunningStage, TrainerFn, TrainerState, TrainerStatus

__all__ = ["RunningStage", "TrainerFn", "TrainerState", "TrainerStatus"]
