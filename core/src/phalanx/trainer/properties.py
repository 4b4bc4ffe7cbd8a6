"""The Trainer's read-only properties: what callbacks, loggers and the Module read (TrainerView).

Kept apart from :mod:`phalanx.trainer.trainer` (the entry points) so each file reads as one thing:
here, every answer the Trainer gives about the stage in progress, the topology, the progress,
the metrics and the callbacks (its configuration and data: :mod:`phalanx.trainer.properties_data`);
each reads the configuration, the strategy or the stage's Run.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from phalanx.callbacks.callback import Callback
from phalanx.callbacks.early_stopping import EarlyStopping
from phalanx.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.callbacks.progress_bar import ProgressBar
from phalanx.errors import MisconfigurationError
from phalanx.trainer.properties_data import ConfigProperties, DataProperties
from phalanx.trainer_view import RunningStage, TrainerState

if TYPE_CHECKING:
    import torch

    from phalanx.trainer.config import TrainerConfig
    from phalanx.trainer.evaluation_loop import EvaluationLoop
    from phalanx.trainer.fit_loop import FitLoop
    from phalanx.trainer.metrics import MetricStore
    from phalanx.trainer.predict_loop import PredictLoop
    from phalanx.trainer.run import Run

__all__ = ["TrainerProperties"]


class TrainerProperties(ConfigProperties, DataProperties):
    """The TrainerView half of :class:`~phalanx.trainer.trainer.Trainer` (set up by its ``__init__``)."""

    config: TrainerConfig
    strategy_name: str
    fit_loop: FitLoop
    val_loop: EvaluationLoop
    test_loop: EvaluationLoop
    predict_loop: PredictLoop
    _strategy: Any
    _num_devices: int
    _callbacks: list[Callback]
    _loggers: list[Any]
    _state: TrainerState
    _metrics: MetricStore
    _module: Any
    _datamodule: Any
    _ckpt_path: str | None
    _profiler: Any
    #: The :class:`~phalanx.trainer.run.Run` of the stage in progress in this process (or the last
    #: one), None before any: the loops' state, set by the Trainer only. Callbacks use the properties.
    #: A plain attribute, not a property: the precision reads it once per optimizer step.
    run: Run | None
    _should_stop: bool

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step in the epoch running now (``Trainer(accumulate_grad_batches)`` at start)."""
        if self.fit_loop.dataloader is None:  # no fit set up yet: what the Trainer was given
            return self.config.accumulate_grad_batches
        return self.fit_loop.accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        """Change accumulation from the next epoch on (Lightning's GradientAccumulationScheduler sets it
        in ``on_train_epoch_start``, which is early enough for that epoch)."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            msg = (
                f"trainer.accumulate_grad_batches = {value!r} is invalid; it must be an int >= 1 (1: step after "
                "every batch). Fix: assign e.g. trainer.accumulate_grad_batches = 2."
            )
            raise MisconfigurationError(msg)
        self.fit_loop.accumulate_grad_batches = value

    @property
    def num_devices(self) -> int:
        """Devices per machine."""
        return self._num_devices

    @property
    def device_ids(self) -> list[int]:
        """Indices of the devices this machine's processes use (``[0, 1]`` for ``devices=2``)."""
        return list(range(self._num_devices))

    @property
    def profiler(self) -> Any:
        """The :class:`~phalanx.profilers.Profiler` of ``Trainer(profiler=...)``, or None."""
        return self._profiler

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint the last entry point restored (``ckpt_path="best"``/``"last"`` resolved), or None."""
        return self._ckpt_path

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """How data is sharded (``num_replicas``, ``rank``), from the strategy; None on one process."""
        return self._strategy.distributed_sampler_kwargs  # type: ignore[no-any-return]

    @property
    def scaler(self) -> Any:
        """The ``torch.amp.GradScaler`` of ``"16-mixed"``, or None."""
        return self._strategy.precision_plugin.scaler

    @property
    def callbacks(self) -> list[Callback]:
        """All callbacks, in call order (checkpointing last)."""
        return self._callbacks

    @property
    def loggers(self) -> list[Any]:
        """All loggers."""
        return self._loggers

    @loggers.setter
    def loggers(self, loggers: list[Any] | None) -> None:
        """Replace the loggers (None: none), as Lightning's setter does."""
        self._loggers = list(loggers or [])

    # ------------------------------------------------------------------ the stage in progress
    @property
    def state(self) -> TrainerState:
        """Entry point, loop and status."""
        return self._state

    @property
    def current_hook(self) -> str | None:
        """The hook or step running now, None between hooks."""
        return self.run.hooks.current if self.run is not None else None

    @property
    def should_stop(self) -> bool:
        """Whether fit stops after the current batch; set it on every rank (early stopping does)."""
        return self.run.should_stop if self.run is not None else self._should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        if self.run is not None:
            self.run.should_stop = bool(value)
        else:
            self._should_stop = bool(value)

    # ------------------------------------------------------------------ topology
    @property
    def strategy(self) -> Any:
        """The configured Strategy (with its accelerator, precision and checkpoint IO)."""
        return self._strategy

    @property
    def accelerator(self) -> Any:
        """The strategy's Accelerator."""
        return self._strategy.accelerator

    @property
    def precision_plugin(self) -> Any:
        """The strategy's Precision."""
        return self._strategy.precision_plugin

    @property
    def precision(self) -> str:
        """The canonical precision name, e.g. ``"bf16-mixed"``."""
        return str(self._strategy.precision_plugin.precision)

    @property
    def global_rank(self) -> int:
        """Rank of this process among all processes."""
        return self._strategy.global_rank

    @property
    def local_rank(self) -> int:
        """Rank of this process on its machine."""
        return self._strategy.local_rank

    @property
    def node_rank(self) -> int:
        """Index of this process's machine."""
        return self._strategy.node_rank

    @property
    def world_size(self) -> int:
        """Number of processes taking part."""
        return self._strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        """Whether this is global rank 0 (the process that logs and writes files)."""
        return bool(self._strategy.is_global_zero)

    # ------------------------------------------------------------------ progress
    @property
    def global_step(self) -> int:
        """Optimizer steps taken (accumulation windows count once)."""
        return self.fit_loop.global_step

    @property
    def current_epoch(self) -> int:
        """The epoch in progress; after fit, the number of completed epochs."""
        return self.fit_loop.epoch

    @property
    def training(self) -> bool:
        """Whether the training loop runs (fitting, outside validation)."""
        return self.state.stage == RunningStage.TRAINING

    @property
    def validating(self) -> bool:
        """Whether a validation loop runs."""
        return self.state.stage == RunningStage.VALIDATING

    @property
    def testing(self) -> bool:
        """Whether the test loop runs."""
        return self.state.stage == RunningStage.TESTING

    @property
    def predicting(self) -> bool:
        """Whether the predict loop runs."""
        return self.state.stage == RunningStage.PREDICTING

    @property
    def sanity_checking(self) -> bool:
        """Whether the sanity validation (``num_sanity_val_steps`` batches before training) runs."""
        return self.state.stage == RunningStage.SANITY_CHECKING

    @property
    def evaluating(self) -> bool:
        """Whether a validation or test loop runs (not the sanity check)."""
        return self.state.stage in (RunningStage.VALIDATING, RunningStage.TESTING)

    @property
    def interrupted(self) -> bool:
        """Whether the last stage ended with an exception (or a keyboard interrupt)."""
        return self.state.status == "interrupted"

    @property
    def received_sigterm(self) -> bool:
        """Whether fit caught a preemption signal (SIGTERM, SIGUSR1) and stopped at a checkpoint."""
        return self.fit_loop.preemption.requested is not None

    @property
    def is_last_batch(self) -> bool:
        """Whether the training batch being run is the last of its epoch."""
        return self.fit_loop.is_last_batch

    @property
    def estimated_stepping_batches(self) -> float:
        """Optimizer steps the whole fit will take (``inf`` when it cannot be known).

        The smaller of ``max_steps`` and what ``max_epochs`` epochs of the training data give
        (accumulation windows counted once, the last partial window of an epoch included, and a
        GradientAccumulationScheduler's factor per epoch); read it from ``configure_optimizers`` on
        to size a schedule (OneCycleLR's ``total_steps``).
        """
        schedule = next((cb for cb in self.callbacks if isinstance(cb, GradientAccumulationScheduler)), None)
        factor_at = schedule.get_accumulate_grad_batches if schedule is not None else None
        return self.fit_loop.estimated_stepping_batches(self.config, factor_at)

    @property
    def validation_has_run(self) -> bool:
        """Whether a validation loop has completed in this stage (its metrics are available)."""
        return self.val_loop.has_run

    # ------------------------------------------------------------------ metrics
    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """Latest logged values (step values during training, aggregates after epochs/evaluation)."""
        return self._metrics.callback_metrics

    @callback_metrics.setter
    def callback_metrics(self, metrics: dict[str, Any]) -> None:
        self._metrics.callback_metrics = dict(metrics)

    @property
    def logged_metrics(self) -> dict[str, float]:
        """Values last sent to the loggers."""
        return self._metrics.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """Values logged with ``prog_bar=True``, as numbers."""
        return {key: float(value) for key, value in self._metrics.progress_bar.items()}

    @property
    def logger(self) -> Any:
        """The first logger, or None."""
        return self.loggers[0] if self.loggers else None

    @logger.setter
    def logger(self, logger: Any) -> None:
        """Make ``logger`` the only logger (None: no logger)."""
        self._loggers = [] if logger is None else [logger]

    @property
    def log_dir(self) -> str:
        """The first logger's run directory, else ``default_root_dir``.

        A logger without a ``log_dir`` path (a duck-typed one) gives its ``save_dir``, as in Lightning.
        """
        logger = self.logger
        for attribute in ("log_dir", "save_dir"):
            directory = getattr(logger, attribute, None) if logger is not None else None
            if isinstance(directory, (str, os.PathLike)):
                return os.fspath(directory)
        return self.default_root_dir

    @property
    def default_checkpoint_dir(self) -> str:
        """Where a ModelCheckpoint without ``dirpath`` writes: ``<log_dir>/checkpoints``."""
        return os.path.join(self.log_dir, "checkpoints")

    # ------------------------------------------------------------------ callbacks & model
    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        """All ModelCheckpoint callbacks."""
        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first ModelCheckpoint, or None."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def early_stopping_callbacks(self) -> list[EarlyStopping]:
        """All EarlyStopping callbacks."""
        return [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]

    @property
    def early_stopping_callback(self) -> EarlyStopping | None:
        """The first EarlyStopping callback, or None."""
        found = self.early_stopping_callbacks
        return found[0] if found else None

    @property
    def progress_bar_callback(self) -> ProgressBar | None:
        """The progress bar callback, or None."""
        return next((cb for cb in self.callbacks if isinstance(cb, ProgressBar)), None)

    @property
    def module(self) -> Any:
        """The Module being run (unwrapped)."""
        return self._module

    lightning_module = module

    @property
    def model(self) -> Any:
        """The model as the strategy runs it (possibly wrapped by DDP/FSDP)."""
        return self._strategy.model if self._strategy.model is not None else self._module

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers from ``configure_optimizers`` (after the strategy set them up)."""
        return self.run.optimizers if self.run is not None else []

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """The scheduler configurations from ``configure_optimizers``."""
        return list(self._strategy.lr_scheduler_configs)

