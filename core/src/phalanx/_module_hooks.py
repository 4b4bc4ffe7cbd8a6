"""The do-nothing hooks of :class:`phalanx.Module`, kept apart from its logic.

The Trainer calls every hook unconditionally (Lightning's contract), so each needs a default. They
live in these mixins so ``module.py`` stays about what a Module *does*; the classes, names, arguments
and call order are Lightning's ``ModelHooks`` / ``DataHooks`` / ``CheckpointHooks`` (importable as
``phalanx.core.hooks``), so ported code, and ``is_overridden(name, obj, DataHooks)``, keep working.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import Optimizer

from phalanx.errors import MisconfigurationError
from phalanx.utilities.apply_func import move_data_to_device

__all__ = ["BatchTransferHooks", "CheckpointHooks", "DataHooks", "ModelHooks", "ModuleHooks"]


def _no_dataloader(module: Any, name: str, argument: str, stage: str) -> MisconfigurationError:
    msg = (
        f"{type(module).__qualname__}.{name}() is not defined and no dataloader was passed to "
        f"{stage}(); pass {argument}=DataLoader(...) to trainer.{stage}() or define {name}()."
    )
    return MisconfigurationError(msg)


class BatchTransferHooks:
    """How a batch reaches the device: Lightning's ``DataHooks`` transfer trio, with defaults.

    A base of :class:`DataHooks` of its own because the strategy checks them on the hot path: a
    Module keeping all three defaults is moved in one call (``strategies/strategy.py``).
    """

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Alter a batch before it moves to the device; identity by default."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a batch to ``device``; override for custom batch types."""
        return move_data_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Alter a batch after it moved to the device; identity by default."""
        return batch


class ModelHooks:
    """The lifecycle, batch and optimizer hooks, empty by default (Lightning's ``ModelHooks``)."""

    def configure_model(self) -> None:
        """Create layers here to build them directly on the device / sharded (called every stage)."""

    def configure_sharded_model(self) -> None:
        """The name :meth:`configure_model` had before Lightning 2.1; still called (before it) when overridden."""

    # ------------------------------------------------------------------ fit / train
    def on_fit_start(self) -> None:
        """Called at the very beginning of fit, after setup and checkpoint restore."""

    def on_fit_end(self) -> None:
        """Called at the very end of fit."""

    def on_train_start(self) -> None:
        """Called when the training loop begins."""

    def on_train_end(self) -> None:
        """Called when the training loop ends."""

    def on_train_epoch_start(self) -> None:
        """Called at the start of each training epoch."""

    def on_train_epoch_end(self) -> None:
        """Called at the end of each training epoch, after the epoch-end validation."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
        """Called before the training step; return ``-1`` to end the epoch early."""
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called after the training step and optimizer step of a batch."""

    # ------------------------------------------------------------------ validation
    def on_validation_start(self) -> None:
        """Called when a validation run begins."""

    def on_validation_end(self) -> None:
        """Called when a validation run ends; its metrics are in ``trainer.callback_metrics``."""

    def on_validation_epoch_start(self) -> None:
        """Called at the start of a validation epoch."""

    def on_validation_epoch_end(self) -> None:
        """Called at the end of a validation epoch, before metrics are aggregated."""

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before each validation step."""

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after each validation step."""

    def on_validation_model_zero_grad(self) -> None:
        """Release the gradients before validation runs inside fit (not in an accumulation window)."""
        self.zero_grad()  # type: ignore[attr-defined]

    def on_validation_model_eval(self) -> None:
        """Put the model in eval mode for validation (override to keep e.g. dropout on)."""
        self.trainer.model.eval()  # type: ignore[attr-defined]

    def on_validation_model_train(self) -> None:
        """Put the model back in train mode after validation."""
        self.trainer.model.train()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ test
    def on_test_start(self) -> None:
        """Called when testing begins."""

    def on_test_end(self) -> None:
        """Called when testing ends."""

    def on_test_epoch_start(self) -> None:
        """Called at the start of the test epoch."""

    def on_test_epoch_end(self) -> None:
        """Called at the end of the test epoch, before metrics are aggregated."""

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before each test step."""

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after each test step."""

    def on_test_model_eval(self) -> None:
        """Put the model in eval mode for testing."""
        self.trainer.model.eval()  # type: ignore[attr-defined]

    def on_test_model_train(self) -> None:
        """Restore train mode after testing."""
        self.trainer.model.train()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ predict
    def on_predict_start(self) -> None:
        """Called when prediction begins."""

    def on_predict_end(self) -> None:
        """Called when prediction ends."""

    def on_predict_epoch_start(self) -> None:
        """Called at the start of the predict epoch."""

    def on_predict_epoch_end(self) -> None:
        """Called at the end of the predict epoch."""

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before each predict step."""

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after each predict step."""

    def on_predict_model_eval(self) -> None:
        """Put the model in eval mode for prediction."""
        self.trainer.model.eval()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ backward & optimizer
    def on_before_zero_grad(self, optimizer: Optimizer) -> None:
        """Called before gradients are reset (start of an accumulation window)."""

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Called with the (accumulation-scaled) loss right before backward."""

    def on_after_backward(self) -> None:
        """Called after backward, before the optimizer step; gradients may still be scaled."""

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        """Called with true-scale gradients right before clipping and the optimizer step."""


class DataHooks(BatchTransferHooks):
    """Where data comes from and how a batch reaches the device (Lightning's ``DataHooks``).

    Attributes:
        prepare_data_per_node: ``True``: :meth:`prepare_data` runs on local rank 0 of every machine
            (each has its own disk); ``False``: only on global rank 0 (a shared filesystem).
        allow_zero_length_dataloader_with_multiple_devices: Accept a dataloader with no batches on
            some ranks instead of raising (Lightning's flag of the same name).
    """

    prepare_data_per_node: bool = True
    allow_zero_length_dataloader_with_multiple_devices: bool = False

    # ------------------------------------------------------------------ setup & teardown
    def prepare_data(self) -> None:
        """Download or preprocess data once per machine (local rank 0), before :meth:`setup`."""

    def setup(self, stage: str) -> None:
        """Per-process setup at the start of ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``."""

    def teardown(self, stage: str) -> None:
        """Per-process cleanup at the end of a stage."""

    # ------------------------------------------------------------------ data
    def train_dataloader(self) -> Any:
        """The training dataloader, used when ``fit`` gets none."""
        raise _no_dataloader(self, "train_dataloader", "train_dataloaders", "fit")

    def val_dataloader(self) -> Any:
        """The validation dataloader(s), used when ``fit``/``validate`` get none."""
        raise _no_dataloader(self, "val_dataloader", "dataloaders", "validate")

    def test_dataloader(self) -> Any:
        """The test dataloader(s), used when ``test`` gets none."""
        raise _no_dataloader(self, "test_dataloader", "dataloaders", "test")

    def predict_dataloader(self) -> Any:
        """The predict dataloader(s), used when ``predict`` gets none."""
        raise _no_dataloader(self, "predict_dataloader", "dataloaders", "predict")


class CheckpointHooks:
    """What a Module adds to and reads from a checkpoint dict (Lightning's ``CheckpointHooks``)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add entries to a checkpoint dict before it is written."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read custom entries from a checkpoint dict before its weights are loaded."""


class ModuleHooks(ModelHooks, DataHooks, CheckpointHooks):
    """All of a Module's hooks, plus the overridable steps of its own (callbacks, backward, scheduler step)."""

    def configure_callbacks(self) -> Any:
        """Callbacks this model needs wherever it is trained (a callback or a list); none by default.

        The Trainer adds them to its own at the start of each stage; one of the same type as a
        Trainer callback replaces it, so the model's settings win (as in Lightning).
        """
        return []

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` (already divided by the accumulation steps); override for a custom backward.

        The precision calls it after scaling the loss; ``args``/``kwargs`` go to ``Tensor.backward``.
        """
        loss.backward(*args, **kwargs)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step one LR scheduler at its interval; ``metric`` is its monitored value (ReduceLROnPlateau), else None.

        Override for a scheduler with another stepping API (e.g. timm's ``step(epoch=...)``).
        """
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)
