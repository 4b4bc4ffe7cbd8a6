"""The Callback base class: code that plugs into the Trainer's loop without touching the Module.

Callbacks hold cross-cutting behaviour (checkpointing, progress display, early stopping) that is
not part of the model. Hook names and arguments follow Lightning's ``Callback`` so existing
callbacks port by changing the import. The Trainer only calls hooks a subclass overrides, so a
callback costs nothing on hooks it ignores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch.optim import Optimizer

if TYPE_CHECKING:
    import torch

    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["Callback"]


class Callback:
    """Base class for Trainer callbacks; override the hooks you need.

    The hooks are those of :data:`phalanx.hooks.CALLBACK_HOOKS` (a test keeps this class and the
    table in step); each receives the Trainer as a :class:`~phalanx.trainer_view.TrainerView`.
    """

    #: Whether ``on_train_epoch_end`` reads the epoch's aggregated metrics: such callbacks
    #: (ModelCheckpoint, early stopping) run after the Module's ``on_train_epoch_end`` and the
    #: aggregation; the others run before them, as Lightning orders them.
    monitors_metrics: ClassVar[bool] = False

    @property
    def state_key(self) -> str:
        """Key of this callback's state in checkpoints; unique per callback configuration."""
        return type(self).__qualname__

    def _generate_state_key(self, **kwargs: Any) -> str:
        """A state key that also encodes configuration, so two instances of a class can coexist."""
        return f"{type(self).__qualname__}{kwargs!r}"

    def state_dict(self) -> dict[str, Any]:
        """State to store in checkpoints; empty by default."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Called at the start of each stage, in every process."""

    def teardown(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Called at the end of each stage, in every process."""

    def on_fit_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when fit begins, after setup and checkpoint restore."""

    def on_fit_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when fit ends."""

    def on_sanity_check_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called before the sanity validation (``num_sanity_val_steps`` batches) that opens fit."""

    def on_sanity_check_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called after the sanity validation."""

    def on_exception(self, trainer: TrainerView, pl_module: Module, exception: BaseException) -> None:
        """Called when a stage is interrupted by ``exception``."""

    # ------------------------------------------------------------------ train
    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when the training loop begins."""

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when the training loop ends."""

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called at the start of each training epoch."""

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called at the end of each training epoch."""

    def on_train_batch_start(self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int) -> None:
        """Called before each training step."""

    def on_train_batch_end(self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called after each training batch (step and optimizer step done)."""

    # ------------------------------------------------------------------ validation / test / predict
    def on_validation_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when a validation run begins."""

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when a validation run ends; its metrics are in ``trainer.callback_metrics``."""

    def on_validation_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called at the start of a validation epoch."""

    def on_validation_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called at the end of a validation epoch."""

    def on_validation_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before each validation step."""

    def on_validation_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after each validation step."""

    def on_test_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when testing begins."""

    def on_test_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when testing ends."""

    def on_test_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called at the start of the test epoch."""

    def on_test_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called at the end of the test epoch."""

    def on_test_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before each test step."""

    def on_test_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after each test step."""

    def on_predict_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when prediction begins."""

    def on_predict_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called when prediction ends."""

    def on_predict_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called at the start of the predict epoch."""

    def on_predict_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called at the end of the predict epoch."""

    def on_predict_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before each predict step."""

    def on_predict_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called after each predict step."""

    # ------------------------------------------------------------------ backward & optimizer
    def on_before_zero_grad(self, trainer: TrainerView, pl_module: Module, optimizer: Optimizer) -> None:
        """Called before gradients are reset."""

    def on_before_backward(self, trainer: TrainerView, pl_module: Module, loss: torch.Tensor) -> None:
        """Called right before backward."""

    def on_after_backward(self, trainer: TrainerView, pl_module: Module) -> None:
        """Called right after backward."""

    def on_before_optimizer_step(self, trainer: TrainerView, pl_module: Module, optimizer: Optimizer) -> None:
        """Called with true-scale gradients before clipping and the optimizer step."""

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, trainer: TrainerView, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        """Add entries to a checkpoint before it is written."""

    def on_load_checkpoint(self, trainer: TrainerView, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        """Read entries from a checkpoint being restored."""
