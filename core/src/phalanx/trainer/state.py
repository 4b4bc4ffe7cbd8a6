"""What the Trainer is doing right now, readable by callbacks and strategies.

``fn`` is the entry point the user called (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``);
``stage`` is the loop running inside it (validation runs inside fit). Both are ``str`` enums, so
``trainer.state.fn == "fit"`` works without importing anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["RunningStage", "TrainerFn", "TrainerState"]


class TrainerFn(str, Enum):
    """The Trainer method being run."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(str, Enum):
    """The loop being run."""

    TRAINING = "train"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


@dataclass
class TrainerState:
    """The current entry point, loop and status (``"running"``, ``"finished"``, ``"interrupted"``)."""

    fn: TrainerFn | None = None
    stage: RunningStage | None = None
    status: str = "initializing"
