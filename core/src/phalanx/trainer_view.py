"""TrainerView: what callbacks, loggers and the Module may know about the Trainer running them.

A callback written for phalanx (in this repository or in a vendor's package) sees the Trainer
through this protocol only: the stage, the loop position, the topology, the metrics, where
checkpoints go, and the two things a callback may set: ``should_stop`` and
``accumulate_grad_batches``. The Trainer's own state (its
loops, its hook runner, the current stage's :class:`~phalanx.trainer.run.Run`) stays behind it, so
the Trainer can change how it runs a step without breaking a single callback. The built-in
callbacks are written against this protocol alone, as a third-party one would be; a test holds
them to it.

The module is torch-free (the stage enums live here too), so it sits at the bottom of the core's
layers and anything may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from phalanx.utilities.enums import LightningEnum

__all__ = ["RunningStage", "TrainerFn", "TrainerState", "TrainerStatus", "TrainerView"]


class TrainerStatus(LightningEnum):
    """Where the Trainer is in its life: built, inside an entry point, or after one."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        """Whether the last entry point has returned, normally or not."""
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class TrainerFn(LightningEnum):
    """The Trainer method being run."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(LightningEnum):
    """The loop being run."""

    TRAINING = "train"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"
    SANITY_CHECKING = "sanity_check"

    @property
    def evaluating(self) -> bool:
        """Whether this loop evaluates (validation, test, or the sanity check)."""
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str | None:
        """The prefix of this loop's dataloader hook: ``"val"`` for validation and the sanity check."""
        if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING):
            return "val"
        return str(self.value)


_STATE_ENUMS: dict[str, type[LightningEnum]] = {"fn": TrainerFn, "stage": RunningStage, "status": TrainerStatus}


@dataclass
class TrainerState:
    """The current entry point, loop and status.

    ``fn`` is the entry point the user called (``"fit"``, ``"validate"``, ...); ``stage`` is the loop
    running inside it (validation runs inside fit); ``status`` is a :class:`TrainerStatus`. All
    three are ``str`` enums, so ``trainer.state.fn == "fit"`` works without importing anything, and
    a string assigned to one is turned into its member.
    """

    fn: TrainerFn | None = None
    stage: RunningStage | None = None
    status: TrainerStatus = TrainerStatus.INITIALIZING

    def __setattr__(self, name: str, value: Any) -> None:
        enum = _STATE_ENUMS.get(name)
        if enum is not None and value is not None and not isinstance(value, enum):
            value = enum(value)
        super().__setattr__(name, value)

    @property
    def finished(self) -> bool:
        """Whether the last entry point returned normally."""
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        """Whether the last entry point has returned, normally or interrupted."""
        return self.status.stopped


@runtime_checkable
class TrainerView(Protocol):
    """The public, read-only face of :class:`phalanx.Trainer` (setters: ``should_stop``, ``accumulate_grad_batches``).

    Every member is documented on the Trainer (docs/trainer.md); :class:`phalanx.Trainer` satisfies
    this protocol, and ``isinstance(trainer, TrainerView)`` is True for it.
    """

    # ------------------------------------------------------------------ what runs
    @property
    def state(self) -> TrainerState:
        """Entry point, loop and status."""

    @property
    def training(self) -> bool:
        """Whether the training loop runs (fitting, outside validation)."""

    @property
    def validating(self) -> bool:
        """Whether a validation loop runs."""

    @property
    def testing(self) -> bool:
        """Whether the test loop runs."""

    @property
    def predicting(self) -> bool:
        """Whether the predict loop runs."""

    @property
    def sanity_checking(self) -> bool:
        """Whether the sanity validation before fit runs (callbacks skip saving and logging then)."""

    @property
    def evaluating(self) -> bool:
        """Whether a validation or test loop runs."""

    @property
    def interrupted(self) -> bool:
        """Whether the last stage ended with an exception."""

    @property
    def received_sigterm(self) -> bool:
        """Whether fit caught a preemption signal."""

    @property
    def fast_dev_run(self) -> int:
        """Batches per loop of a ``fast_dev_run`` (0: off); a fast dev run writes no checkpoints or logs."""

    @property
    def num_sanity_val_batches(self) -> list[float]:
        """Batches per validation dataloader the sanity check runs."""

    @property
    def is_last_batch(self) -> bool:
        """Whether the training batch being run is the last of its epoch."""

    @property
    def current_hook(self) -> str | None:
        """The hook or step the Trainer is running now (``"training_step"``, ``"on_train_epoch_end"``...)."""

    # ------------------------------------------------------------------ progress
    @property
    def current_epoch(self) -> int:
        """The epoch in progress; after fit, the number of completed epochs."""

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (an accumulation window counts once)."""

    @property
    def max_epochs(self) -> int | None:
        """The epoch limit (-1: none); None before ``fit`` when ``Trainer(max_epochs=None)``."""

    @property
    def max_steps(self) -> int:
        """The optimizer-step limit (-1: none)."""

    @property
    def num_training_batches(self) -> float:
        """Training batches per epoch after ``limit_train_batches`` (``inf`` without a length)."""

    @property
    def num_val_batches(self) -> list[float]:
        """Validation batches per dataloader."""

    @property
    def num_test_batches(self) -> list[float]:
        """Test batches per dataloader."""

    @property
    def num_predict_batches(self) -> list[float]:
        """Predict batches per dataloader."""

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps the whole fit will take (``inf`` when it cannot be known)."""

    @property
    def validation_enabled(self) -> bool:
        """Whether this fit validates at all (validation data and a ``validation_step``)."""

    @property
    def validation_has_run(self) -> bool:
        """Whether a validation loop has completed in this fit (its metrics are available)."""

    @property
    def check_val_every_n_epoch(self) -> int | None:
        """Validate every N epochs (None: count batches across epochs)."""

    @property
    def val_check_interval(self) -> int | float:
        """Validate every N batches (int) or fraction of an epoch (float)."""

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step in the epoch running now."""

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        """Change it from the next epoch start on (GradientAccumulationScheduler sets it in
        ``on_train_epoch_start``, which still counts for that epoch)."""

    @property
    def log_every_n_steps(self) -> int:
        """How often step metrics go to the loggers."""

    # ------------------------------------------------------------------ the one thing to set
    @property
    def should_stop(self) -> bool:
        """Whether fit stops after the current batch; callbacks (early stopping) set it on every rank."""

    @should_stop.setter
    def should_stop(self, value: bool) -> None: ...

    # ------------------------------------------------------------------ topology
    @property
    def world_size(self) -> int:
        """Number of processes taking part."""

    @property
    def global_rank(self) -> int:
        """Rank of this process among all processes."""

    @property
    def local_rank(self) -> int:
        """Rank of this process on its machine."""

    @property
    def node_rank(self) -> int:
        """Index of this process's machine."""

    @property
    def num_nodes(self) -> int:
        """Machines taking part."""

    @property
    def num_devices(self) -> int:
        """Devices per machine."""

    @property
    def is_global_zero(self) -> bool:
        """Whether this is global rank 0 (the process that logs and writes files)."""

    @property
    def strategy(self) -> Any:
        """The Strategy (collectives: ``broadcast``, ``reduce``, ``barrier``, ...)."""

    @property
    def strategy_name(self) -> str:
        """The registry name the strategy was resolved from (``"ddp"``, ``"fsdp"``...)."""

    @property
    def precision(self) -> str:
        """The canonical precision name, e.g. ``"bf16-mixed"``."""

    # ------------------------------------------------------------------ model and data
    @property
    def lightning_module(self) -> Any:
        """The Module being run (unwrapped)."""

    @property
    def model(self) -> Any:
        """The model as the strategy runs it (possibly wrapped by DDP/FSDP)."""

    @property
    def optimizers(self) -> list[Any]:
        """The optimizers from ``configure_optimizers``."""

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """The scheduler configurations from ``configure_optimizers``."""

    @property
    def train_dataloader(self) -> Any:
        """The training dataloader of the current fit, as prepared (sharded, limited), or None."""

    @property
    def datamodule(self) -> Any:
        """The DataModule of this stage, or None."""

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint the last entry point restored, or None."""

    @property
    def min_epochs(self) -> int | None:
        """Epochs before ``should_stop`` may end fit."""

    @property
    def min_steps(self) -> int | None:
        """Optimizer steps before ``should_stop`` may end fit."""

    # ------------------------------------------------------------------ metrics, loggers, files
    @property
    def callback_metrics(self) -> dict[str, Any]:
        """Latest logged values (tensors): step values in training, aggregates after epochs."""

    @property
    def logged_metrics(self) -> dict[str, float]:
        """Values last sent to the loggers."""

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """Values logged with ``prog_bar=True``, as numbers."""

    @property
    def loggers(self) -> list[Any]:
        """All loggers."""

    @property
    def logger(self) -> Any:
        """The first logger, or None."""

    @property
    def callbacks(self) -> list[Any]:
        """All callbacks, in call order."""

    @property
    def default_root_dir(self) -> str:
        """Where logs and checkpoints go without a logger."""

    @property
    def log_dir(self) -> str:
        """The first logger's run directory, else ``default_root_dir``."""

    @property
    def default_checkpoint_dir(self) -> str:
        """Where a ModelCheckpoint without ``dirpath`` writes: ``<log_dir>/checkpoints``."""

    def save_checkpoint(self, filepath: Any, weights_only: bool = False, storage_options: Any = None) -> None:
        """Write a checkpoint of the current state; a collective (every rank calls it)."""

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only, without breaking the progress bar."""
