"""The Trainer: runs a Module's fit / validate / test / predict through a pluggable Strategy.

Arguments are validated and the strategy is resolved in ``__init__`` (so a typo or a missing plugin
fails immediately); each entry point checks its inputs in the calling process, then runs the
stage body (:mod:`phalanx.trainer.run`) directly or, for parallel strategies, through
``strategy.launcher.launch`` once per rank.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from phalanx.callbacks.callback import Callback
from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.callbacks.progress import TQDMProgressBar
from phalanx.errors import MisconfigurationError
from phalanx.trainer import _args, checkpointing
from phalanx.trainer.connector import resolve_strategy
from phalanx.trainer.entry import check_eval, check_fit
from phalanx.trainer.evaluation_loop import EvaluationLoop
from phalanx.trainer.fit_loop import FitLoop
from phalanx.trainer.hooks import HookDispatch
from phalanx.trainer.logging_connector import LoggerConnector
from phalanx.trainer.predict_loop import PredictLoop
from phalanx.trainer.run import run_stage
from phalanx.trainer.state import RunningStage, TrainerFn, TrainerState

__all__ = ["Trainer"]


class Trainer(HookDispatch):
    """Train, evaluate and predict with a :class:`phalanx.Module` (arguments as in Lightning; see
    docs/trainer.md for each one)."""

    def __init__(
        self,
        *,
        accelerator: Any = "auto",
        strategy: Any = "auto",
        devices: Any = "auto",
        num_nodes: int = 1,
        precision: Any = "32-true",
        plugins: Any = None,
        callbacks: Callback | list[Callback] | None = None,
        logger: Any = True,
        max_epochs: int | None = None,
        max_steps: int = -1,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str = "norm",
        log_every_n_steps: int = 50,
        enable_checkpointing: bool = True,
        enable_progress_bar: bool = True,
        default_root_dir: str | os.PathLike[str] | None = None,
        deterministic: bool | str = False,
        use_distributed_sampler: bool = True,
        sync_batchnorm: bool = False,
    ) -> None:
        self.num_nodes = _args.check_int("num_nodes", num_nodes, minimum=1)
        self.max_steps: int = _args.check_int("max_steps", max_steps, minimum=-1, example=1000)  # type: ignore[assignment]
        epochs = _args.check_max_epochs(max_epochs)
        self.max_epochs: int = (1000 if self.max_steps == -1 else -1) if epochs is None else epochs
        self.limit_train_batches = _args.check_limit("limit_train_batches", limit_train_batches)
        self.limit_val_batches = _args.check_limit("limit_val_batches", limit_val_batches)
        self.limit_test_batches = _args.check_limit("limit_test_batches", limit_test_batches)
        self.limit_predict_batches = _args.check_limit("limit_predict_batches", limit_predict_batches)
        self.val_check_interval = _args.check_val_check_interval(val_check_interval)
        self.check_val_every_n_epoch = _args.check_int(
            "check_val_every_n_epoch", check_val_every_n_epoch, minimum=1, allow_none=True
        )
        self.accumulate_grad_batches: int = _args.check_int(
            "accumulate_grad_batches", accumulate_grad_batches, minimum=1
        )  # type: ignore[assignment]
        self.gradient_clip_val, self.gradient_clip_algorithm = _args.check_clip(
            gradient_clip_val, gradient_clip_algorithm
        )
        self.log_every_n_steps: int = _args.check_int("log_every_n_steps", log_every_n_steps, minimum=1)  # type: ignore[assignment]
        enable_checkpointing = _args.check_bool("enable_checkpointing", enable_checkpointing)
        enable_progress_bar = _args.check_bool("enable_progress_bar", enable_progress_bar)
        self.use_distributed_sampler = _args.check_bool("use_distributed_sampler", use_distributed_sampler)
        self.sync_batchnorm = _args.check_bool("sync_batchnorm", sync_batchnorm)
        self.deterministic = _args.check_deterministic(deterministic)
        self.default_root_dir = _args.check_root_dir(default_root_dir)
        user_callbacks = _args.check_callbacks(callbacks)
        self.loggers: list[Any] = _args.check_loggers(logger, self.default_root_dir)
        resolved = resolve_strategy(
            accelerator=accelerator,
            strategy=strategy,
            devices=devices,
            num_nodes=self.num_nodes,  # type: ignore[arg-type]
            precision=precision,
            plugins=_args.check_plugins(plugins),
            sync_batchnorm=self.sync_batchnorm,
        )
        self._strategy = resolved.strategy
        self._strategy_name = resolved.strategy_name
        self.num_devices = resolved.num_devices
        self.callbacks: list[Callback] = _args.add_default_callbacks(
            user_callbacks, enable_checkpointing, enable_progress_bar
        )
        self.state = TrainerState()
        self.should_stop = False
        self.fit_loop = FitLoop(self)
        self.val_loop = EvaluationLoop(self, "validate")
        self.test_loop = EvaluationLoop(self, "test")
        self.predict_loop = PredictLoop(self)
        self._logger_connector = LoggerConnector(self)
        self._module: Any = None
        self._current_fx: str | None = None
        self._custom_clipping = False
        self._optimizers: list[torch.optim.Optimizer] = []
        self._wrapped_optimizers: list[Any] = []
        self._has_validation = False
        self._hooks: dict[str, list[Any]] = {}
        self._module_hooks: dict[str, Any] = {}
        self._epoch_end_hooks: dict[bool, list[Any]] = {False: [], True: []}

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
        """Always False: phalanx runs no sanity validation (kept for Lightning callbacks)."""
        return False

    @property
    def num_training_batches(self) -> float:
        """Training batches per epoch after ``limit_train_batches`` (``inf`` without a length)."""
        return self.fit_loop.num_batches

    @property
    def num_val_batches(self) -> list[float]:
        """Validation batches per dataloader."""
        return list(self.val_loop.num_batches)

    @property
    def num_test_batches(self) -> list[float]:
        """Test batches per dataloader."""
        return list(self.test_loop.num_batches)

    @property
    def num_predict_batches(self) -> list[float]:
        """Predict batches per dataloader."""
        return list(self.predict_loop.num_batches)

    # ------------------------------------------------------------------ metrics
    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """Latest logged values (step values during training, aggregates after epochs/evaluation)."""
        return self._logger_connector.callback_metrics

    @callback_metrics.setter
    def callback_metrics(self, metrics: dict[str, Any]) -> None:
        self._logger_connector.callback_metrics = dict(metrics)

    @property
    def logged_metrics(self) -> dict[str, float]:
        """Values last sent to the loggers."""
        return self._logger_connector.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """Values logged with ``prog_bar=True``, as numbers."""
        return {key: float(value) for key, value in self._logger_connector.progress_bar.items()}

    @property
    def logger(self) -> Any:
        """The first logger, or None."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """The first logger's run directory, else ``default_root_dir``."""
        logger = self.logger
        directory = getattr(logger, "log_dir", None) if logger is not None else None
        return directory if directory is not None else self.default_root_dir

    def _default_checkpoint_dir(self) -> str:
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
    def progress_bar_callback(self) -> TQDMProgressBar | None:
        """The progress bar callback, or None."""
        return next((cb for cb in self.callbacks if isinstance(cb, TQDMProgressBar)), None)

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
        return self._optimizers

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """The scheduler configurations from ``configure_optimizers``."""
        return list(self._strategy.lr_scheduler_configs)

    @property
    def _validation_has_run(self) -> bool:
        return self.val_loop.has_run

    def _require_module(self, action: str) -> Any:
        if self._module is None:
            msg = f"Trainer.{action} needs a model: call it during or after fit/validate/test/predict."
            raise MisconfigurationError(msg)
        return self._module

    # ------------------------------------------------------------------ entry points
    def fit(
        self, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None, *, ckpt_path: Any = None
    ) -> None:
        """Train ``model``; ``ckpt_path`` (a path or ``"last"``) resumes exactly where that checkpoint left off.

        Raises:
            MisconfigurationError: ``model`` is not a Module or lacks ``training_step``/``configure_optimizers``.
            CheckpointError: ``ckpt_path`` is missing, unreadable, weights-only or of another model.
        """
        path = check_fit(self, model, train_dataloaders, val_dataloaders, ckpt_path)
        loaders = {"train": train_dataloaders, "val": val_dataloaders}
        self._launch(TrainerFn.FITTING, model, loaders, path, {})

    def validate(
        self, model: Any = None, dataloaders: Any = None, *, ckpt_path: Any = None, verbose: bool = True
    ) -> list[dict[str, float]]:
        """Run one validation epoch; returns the logged epoch metrics per dataloader."""
        model, path = check_eval(self, TrainerFn.VALIDATING, model, dataloaders, ckpt_path)
        return self._launch(TrainerFn.VALIDATING, model, {"eval": dataloaders}, path, {"verbose": verbose})  # type: ignore[no-any-return]

    def test(
        self, model: Any = None, dataloaders: Any = None, *, ckpt_path: Any = None, verbose: bool = True
    ) -> list[dict[str, float]]:
        """Run one test epoch; returns the logged epoch metrics per dataloader."""
        model, path = check_eval(self, TrainerFn.TESTING, model, dataloaders, ckpt_path)
        return self._launch(TrainerFn.TESTING, model, {"eval": dataloaders}, path, {"verbose": verbose})  # type: ignore[no-any-return]

    def predict(
        self, model: Any = None, dataloaders: Any = None, *, ckpt_path: Any = None, return_predictions: bool = True
    ) -> Any:
        """Run ``predict_step`` over the data; returns the predictions (a list per dataloader)."""
        model, path = check_eval(self, TrainerFn.PREDICTING, model, dataloaders, ckpt_path)
        options = {"return_predictions": return_predictions}
        return self._launch(TrainerFn.PREDICTING, model, {"eval": dataloaders}, path, options)

    def _launch(
        self, fn: TrainerFn, model: Any, loaders: dict[str, Any], ckpt_path: str | None, options: dict[str, Any]
    ) -> Any:
        self._module = model  # the launcher copies results back into this process's Module
        launcher = self._strategy.launcher
        if launcher is not None:
            return launcher.launch(self._run_stage, fn, model, loaders, ckpt_path, options, trainer=self)
        return self._run_stage(fn, model, loaders, ckpt_path, options)

    def _run_stage(
        self, fn: TrainerFn, model: Any, loaders: dict[str, Any], ckpt_path: str | None, options: dict[str, Any]
    ) -> Any:
        """The per-rank body of an entry point; what ``strategy.launcher.launch`` runs on each rank."""
        return run_stage(self, fn, model, loaders, ckpt_path, options)

    def plan(
        self,
        model: Any,
        *,
        input_shape: tuple[int, ...] | None = None,
        input_dtype: str | None = None,
        device_memory: int | str | None = None,
        optimizer: str | None = None,
    ) -> Any:
        """Dry run: validate this configuration with ``model`` and estimate per-rank memory, launching nothing.

        Everything ``Trainer(...)`` checks (names, devices, nodes, mesh sizes, plugin availability)
        has passed already; this adds the model (an ``nn.Module`` with ``training_step`` and
        ``configure_optimizers``, describable on the meta device) and asks the strategy's plugin
        what one rank would hold. A model without weights yet (``configure_model``) is sized on a
        meta-device copy. Returns a :class:`phalanx.memory.PlanReport`; ``print`` it for the table.

        Args:
            model: The Module ``fit`` would get.
            input_shape: One micro-batch per rank, e.g. ``(1, 2048)``, to estimate activations.
            input_dtype: Its dtype name (default ``int64`` after an ``nn.Embedding``, else ``float32``).
            device_memory: Memory of one device (``"80GiB"`` or bytes), to say whether it fits.
            optimizer: Optimizer kind; default: read from ``configure_optimizers``.

        Raises:
            MisconfigurationError: A bad model, optimizer or device memory, naming the fix.
        """
        from phalanx.trainer.dry_run import plan_run

        return plan_run(
            self, model, input_shape=input_shape, input_dtype=input_dtype, device_memory=device_memory, optimizer=optimizer
        )

    def save_checkpoint(
        self, filepath: str | os.PathLike[str], weights_only: bool = False, storage_options: Any = None
    ) -> None:
        """Write a checkpoint of the current state; call it on every rank (rank 0 writes).

        Raises:
            MisconfigurationError: No model yet (nothing has been run).
        """
        if not isinstance(filepath, (str, os.PathLike)):
            msg = f"Trainer.save_checkpoint(filepath={filepath!r}) needs a path (str or os.PathLike)."
            raise MisconfigurationError(msg)
        checkpoint = checkpointing.dump_checkpoint(self, weights_only=weights_only)
        self._strategy.save_checkpoint(checkpoint, os.fspath(filepath), storage_options=storage_options)
        self._strategy.barrier("Trainer.save_checkpoint")
