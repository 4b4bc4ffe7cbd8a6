"""GradientAccumulationScheduler: change how many batches make one optimizer step, epoch by epoch.

Small effective batches early (many cheap, noisy updates) and larger ones later (fewer, smoother
updates) is a common recipe; this callback sets ``trainer.accumulate_grad_batches`` at the start
of each training epoch from a ``{epoch: factor}`` schedule, as Lightning's callback does. The
Trainer reads the factor once per epoch, steps the optimizer after the last batch of an epoch even
when its window is incomplete, divides each loss by the factor, and counts each window once in
``trainer.global_step`` and ``trainer.estimated_stepping_batches`` (which follows the schedule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.utilities.model_helpers import is_overridden
from phalanx.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["GradientAccumulationScheduler"]


class GradientAccumulationScheduler(Callback):
    """Set the gradient accumulation factor per epoch from ``scheduling``.

    Epochs are zero-indexed: ``{4: 2}`` accumulates 2 batches from the fifth epoch on. A schedule
    that does not start at epoch 0 gets ``{0: 1}`` added (no accumulation until the first key).

    Args:
        scheduling: ``{epoch: factor}``; keys ints >= 0, values ints >= 1.

    Raises:
        TypeError: ``scheduling`` is empty (Lightning's error type).
        MisconfigurationError: A key is not an int >= 0 or a value not an int >= 1.
        RuntimeError: At ``on_train_start``, the Module uses manual optimization or the strategy
            accumulates gradients itself (DeepSpeed: its factor is fixed when the engine is built).
        ValueError: At ``on_train_start``, the Trainer was also given ``accumulate_grad_batches != 1``.

    Example::

        from phalanx import Trainer
        from phalanx.callbacks import GradientAccumulationScheduler

        # one batch per step in epochs 0-3, then 2, and 4 from epoch 8 on
        trainer = Trainer(callbacks=[GradientAccumulationScheduler(scheduling={4: 2, 8: 4})])
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not scheduling:
            msg = (
                f"GradientAccumulationScheduler(scheduling={scheduling!r}): an empty schedule cannot be interpreted; "
                "pass {epoch: factor}, e.g. {0: 1, 4: 2}."
            )
            raise TypeError(msg)
        if any(isinstance(key, bool) or not isinstance(key, int) or key < 0 for key in scheduling):
            msg = (
                f"GradientAccumulationScheduler: Epoch should be an int >= 0 (zero-indexed). Got {list(scheduling)}. "
                "Fix: use keys like {0: 1, 4: 2}."
            )
            raise MisconfigurationError(msg)
        if any(isinstance(value, bool) or not isinstance(value, int) or value < 1 for value in scheduling.values()):
            msg = (
                "GradientAccumulationScheduler: Accumulation factor should be an int > 0 (1: no accumulation). "
                f"Got {list(scheduling.values())}. Fix: use values like {{0: 1, 4: 2}}."
            )
            raise MisconfigurationError(msg)
        if min(scheduling) != 0:  # Lightning adds the first epoch's factor to the caller's dict too
            scheduling.update({0: 1})
        self.scheduling = scheduling
        self.epochs = sorted(scheduling)

    def going_to_accumulate_grad_batches(self) -> bool:
        """Whether any epoch of the schedule accumulates more than one batch."""
        return any(value > 1 for value in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor for ``epoch``: the value of the largest scheduled epoch not after it."""
        for start in reversed(self.epochs):
            if epoch >= start:
                return self.scheduling[start]
        return 1

    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Refuse what cannot follow a schedule, then set the factor of the epoch training starts in.

        Setting it here too matters when fit resumes in the middle of an epoch: that epoch's
        ``on_train_epoch_start`` already ran before the checkpoint, so it does not run again.
        """
        if not pl_module.automatic_optimization:
            msg = (
                "Automatic gradient accumulation and the `GradientAccumulationScheduler` is not supported for manual "
                "optimization (automatic_optimization=False). Please remove the callback or switch to automatic "
                "optimization."
            )
            raise RuntimeError(msg)
        overridden = is_overridden("optimizer_step", pl_module, Module) or is_overridden(
            "optimizer_zero_grad", pl_module, Module
        )
        if overridden and self.going_to_accumulate_grad_batches():
            rank_zero_warn(
                "When using `Trainer(accumulate_grad_batches != 1)` and overriding "
                "`Module.optimizer_{step,zero_grad}`, the hooks will not be called on every batch "
                "(rather, they are called on every optimization step)."
            )
        if trainer.strategy.handles_gradient_accumulation:
            msg = (
                f"The `{type(trainer.strategy).__name__}` does not support `accumulate_grad_batches` changing between "
                "epochs: it accumulates gradients itself with a factor fixed at setup. Remove the "
                "GradientAccumulationScheduler or use another strategy."
            )
            raise RuntimeError(msg)
        if trainer.accumulate_grad_batches != 1:
            msg = (
                "You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler` callback "
                f"(Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches})). Either remove "
                "`accumulate_grad_batches` from the Trainer or remove the callback."
            )
            raise ValueError(msg)
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Set this epoch's factor (the Trainer reads it once the epoch-start hooks have run)."""
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)
