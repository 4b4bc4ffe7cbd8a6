"""The Trainer: runs a Module's fit / validate / test / predict through a pluggable Strategy.

Arguments are validated and the strategy is resolved in ``__init__`` (so a typo or a missing plugin
fails immediately); each entry point checks its inputs in the calling process, then runs the
stage body (:mod:`phalanx.trainer.stage`, over a fresh :class:`~phalanx.trainer.run.Run`) directly
or, for parallel strategies, through ``strategy.launcher.launch`` once per rank. The read-only
properties callbacks see are in :mod:`phalanx.trainer.properties`.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import datetime
import os
from collections.abc import Iterator
from typing import Any

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.loggers.logger import DummyLogger, Logger
from phalanx.trainer import arguments, checkpointing, components, entry_points
from phalanx.trainer.config import TrainerConfig
from phalanx.trainer.evaluation_loop import EvaluationLoop
from phalanx.trainer.fit_loop import FitLoop
from phalanx.trainer.hook_runner import HookRunner
from phalanx.trainer.metrics import MetricStore
from phalanx.trainer.predict_loop import PredictLoop
from phalanx.trainer.properties import TrainerProperties
from phalanx.trainer.run import Run
from phalanx.trainer.stage import run_stage
from phalanx.trainer.strategy_resolution import resolve_strategy
from phalanx.trainer_view import RunningStage, TrainerFn, TrainerState, TrainerStatus
from phalanx.utilities.paths import check_path
from phalanx.utilities.rank_zero import rank_zero_info, rank_zero_warn
from phalanx.utilities.warnings import PossibleUserWarning

__all__ = ["Trainer"]

_FIRST_STAGE = {
    TrainerFn.FITTING: RunningStage.TRAINING,
    TrainerFn.VALIDATING: RunningStage.VALIDATING,
    TrainerFn.TESTING: RunningStage.TESTING,
    TrainerFn.PREDICTING: RunningStage.PREDICTING,
}


class Trainer(TrainerProperties):
    """Train, evaluate and predict with a :class:`phalanx.Module` (arguments as in Lightning; see
    docs/trainer.md for each one).

    A façade: ``Trainer(...)`` validates its arguments into a frozen :class:`TrainerConfig` and
    resolves the strategy; each entry point hands one stage to the strategy's launcher, which runs
    it in every rank as a :class:`~phalanx.trainer.run.Run`. Everything callbacks, loggers and the
    Module read is a public property here (the :class:`~phalanx.trainer_view.TrainerView` protocol).
    """

    @arguments.defaults_from_env
    def __init__(
        self,
        *,
        accelerator: Any = "auto",
        strategy: Any = "auto",
        devices: Any = "auto",
        num_nodes: int = 1,
        precision: Any = None,
        logger: Logger | list[Logger] | bool | str | None = None,
        callbacks: Callback | str | list[Callback | str] | None = None,
        fast_dev_run: int | bool = False,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        max_time: Any = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        log_every_n_steps: int | None = None,
        enable_checkpointing: bool | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
        deterministic: bool | str | None = None,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        use_distributed_sampler: bool = True,
        profiler: Any = None,
        detect_anomaly: bool = False,
        barebones: bool = False,
        plugins: Any = None,
        sync_batchnorm: bool = False,
        reload_dataloaders_every_n_epochs: int = 0,
        default_root_dir: str | os.PathLike[str] | None = None,
        enable_autolog_hparams: bool = True,
        model_registry: str | None = None,
        hang_report_after: float | datetime.timedelta | None = 50.0,
    ) -> None:
        barebones = arguments.check_barebones(
            barebones,
            {
                "logger": logger,
                "enable_checkpointing": enable_checkpointing,
                "enable_progress_bar": enable_progress_bar,
                "enable_model_summary": enable_model_summary,
                "num_sanity_val_steps": num_sanity_val_steps,
                "log_every_n_steps": log_every_n_steps,
                "profiler": profiler,
                "detect_anomaly": detect_anomaly,
            },
        )
        arguments.check_model_registry(model_registry)
        on = not barebones  # each feature flag's default
        self.config: TrainerConfig = arguments.build_config(
            num_nodes=num_nodes,
            max_epochs=max_epochs,
            min_epochs=min_epochs,
            max_steps=max_steps,
            min_steps=min_steps,
            max_time=max_time,
            limits={
                "train": limit_train_batches,
                "val": limit_val_batches,
                "test": limit_test_batches,
                "predict": limit_predict_batches,
            },
            overfit_batches=overfit_batches,
            val_check_interval=val_check_interval,
            check_val_every_n_epoch=check_val_every_n_epoch,
            num_sanity_val_steps=num_sanity_val_steps,
            fast_dev_run=fast_dev_run,
            accumulate_grad_batches=accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            log_every_n_steps=log_every_n_steps,
            use_distributed_sampler=use_distributed_sampler,
            sync_batchnorm=sync_batchnorm,
            deterministic=deterministic,
            benchmark=benchmark,
            inference_mode=inference_mode,
            detect_anomaly=detect_anomaly,
            reload_dataloaders_every_n_epochs=reload_dataloaders_every_n_epochs,
            default_root_dir=default_root_dir,
            barebones=barebones,
            enable_model_summary=arguments.check_bool(
                "enable_model_summary", on if enable_model_summary is None else enable_model_summary
            ),
            enable_autolog_hparams=enable_autolog_hparams,
            hang_report_after=hang_report_after,
        )
        enable_checkpointing = arguments.check_bool("enable_checkpointing", on if enable_checkpointing is None else enable_checkpointing)
        enable_progress_bar = arguments.check_bool("enable_progress_bar", on if enable_progress_bar is None else enable_progress_bar)
        user_callbacks = components.check_callbacks(callbacks)
        self._loggers: list[Any] = components.check_loggers(on if logger is None else logger, self.config.default_root_dir)
        if self.config.fast_dev_run:
            # A fast_dev_run writes nothing: a DummyLogger stands in for the loggers (as in Lightning,
            # so code calling trainer.logger still runs), and ModelCheckpoint skips saving.
            self._loggers = [DummyLogger()] if self._loggers else []
            rank_zero_info(
                f"Running in fast_dev_run mode: each loop runs {self.config.fast_dev_run} batch(es); "
                "logging and checkpointing are off."
            )
        resolved = resolve_strategy(
            accelerator=accelerator,
            strategy=strategy,
            devices=devices,
            num_nodes=self.config.num_nodes,
            precision="32-true" if precision is None else precision,
            plugins=arguments.check_plugins(plugins),
            sync_batchnorm=self.config.sync_batchnorm,
        )
        self._strategy = resolved.strategy
        #: The registry name the strategy was resolved from (recorded in checkpoints).
        self.strategy_name: str = resolved.strategy_name
        self._num_devices: int = resolved.num_devices
        self._callbacks: list[Callback] = components.add_default_callbacks(
            user_callbacks, enable_checkpointing, enable_progress_bar, self.config
        )
        self._profiler: Any = components.check_profiler(profiler)
        self._state = TrainerState()
        self.val_loop = EvaluationLoop("validate")
        self.fit_loop = FitLoop(self.val_loop)
        self.test_loop = EvaluationLoop("test")
        self.predict_loop = PredictLoop()
        self._metrics = MetricStore(self)
        self._module: Any = None
        self._datamodule: Any = None
        self._ckpt_path: str | None = None
        self.run: Run | None = None
        self._should_stop = False

    @contextlib.contextmanager
    def init_module(self, empty_init: bool | None = None) -> Iterator[None]:
        """Create the Module's tensors where the strategy wants them, in the precision's dtype.

        ``with trainer.init_module(): model = MyModel()`` builds the weights on the device and in
        ``"bf16-true"``/``"16-true"`` dtype directly; with ``empty_init=True`` the strategy may skip
        random initialisation (or build on the meta device) because a checkpoint or
        ``configure_model`` fills the weights later.
        """
        with self._strategy.tensor_init_context(empty_init=empty_init):
            yield

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only, above the progress bar instead of through it."""
        if not self.is_global_zero:
            return
        bar = self.progress_bar_callback
        if bar is not None and bar.is_enabled:
            bar.print(*args, **kwargs)
        else:
            builtins.print(*args, **kwargs)

    def receive_worker_results(self, *, callback_metrics: dict[str, Any] | None, epoch: int | None, global_step: int | None) -> None:
        """Take over what the ranks of a launched stage computed (called by launchers in this process).

        After ``fit`` ran in worker processes (spawn, fork), ``trainer.global_step``,
        ``current_epoch`` and ``callback_metrics`` of the calling process show the workers' final
        values, as they do after ``strategy="ddp"``.
        """
        if callback_metrics is not None:
            self._metrics.callback_metrics.clear()
            self._metrics.callback_metrics.update(callback_metrics)
        if epoch is not None and global_step is not None:
            self.fit_loop.epoch, self.fit_loop.global_step = int(epoch), int(global_step)

    # ------------------------------------------------------------------ entry points
    def fit(
        self,
        model: Any,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: Any = None,
        ckpt_path: Any = None,
        weights_only: bool | None = None,
    ) -> None:
        """Train ``model``; ``ckpt_path`` (a path or ``"last"``) resumes exactly where that checkpoint left off.

        The data comes from ``train_dataloaders`` / ``val_dataloaders``, a ``datamodule`` (also
        accepted in the first position), or the Module's own dataloader methods. A
        ``torch.compile(module)`` trains ``module`` with its forward and steps compiled.

        Raises:
            MisconfigurationError: ``model`` is not a Module or lacks ``training_step``/``configure_optimizers``.
            CheckpointError: ``ckpt_path`` is missing, unreadable, weights-only or of another model.
        """
        model = entry_points.unwrap_compiled(model)
        train_dataloaders, datamodule = entry_points.split_datamodule(train_dataloaders, datamodule)
        path = entry_points.check_fit(self, model, train_dataloaders, val_dataloaders, datamodule, ckpt_path)
        loaders = {"train": train_dataloaders, "val": val_dataloaders, "datamodule": datamodule}
        self._settle_max_epochs()
        self._launch(TrainerFn.FITTING, model, loaders, path, {})

    def _settle_max_epochs(self) -> None:
        """``max_epochs=None`` becomes 1000 (with a warning) unless ``max_steps`` or a Timer bounds the run, then -1."""
        if self.config.max_epochs_set:
            return
        from phalanx.callbacks.timer import Timer

        epochs = -1
        if self.config.max_steps == -1 and not any(isinstance(cb, Timer) for cb in self._callbacks):
            rank_zero_warn(
                "`max_epochs` was not set. Setting it to 1000 epochs. To train without an epoch limit, set `max_epochs=-1`.",
                category=PossibleUserWarning,
            )
            epochs = 1000
        self.config = dataclasses.replace(self.config, max_epochs=epochs, max_epochs_set=True)

    def validate(
        self,
        model: Any = None,
        dataloaders: Any = None,
        ckpt_path: Any = None,
        verbose: bool = True,
        datamodule: Any = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run one validation epoch; returns the logged epoch metrics per dataloader."""
        return self._evaluate(TrainerFn.VALIDATING, model, dataloaders, datamodule, ckpt_path, {"verbose": verbose})  # type: ignore[no-any-return]

    def test(
        self,
        model: Any = None,
        dataloaders: Any = None,
        ckpt_path: Any = None,
        verbose: bool = True,
        datamodule: Any = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run one test epoch; returns the logged epoch metrics per dataloader."""
        return self._evaluate(TrainerFn.TESTING, model, dataloaders, datamodule, ckpt_path, {"verbose": verbose})  # type: ignore[no-any-return]

    def predict(
        self,
        model: Any = None,
        dataloaders: Any = None,
        datamodule: Any = None,
        return_predictions: bool | None = None,
        ckpt_path: Any = None,
        weights_only: bool | None = None,
    ) -> Any:
        """Run ``predict_step`` over the data; returns the predictions (a list per dataloader)."""
        options = {"return_predictions": True if return_predictions is None else return_predictions}
        return self._evaluate(TrainerFn.PREDICTING, model, dataloaders, datamodule, ckpt_path, options)

    def _evaluate(
        self, fn: TrainerFn, model: Any, dataloaders: Any, datamodule: Any, ckpt_path: Any, options: dict[str, Any]
    ) -> Any:
        model = entry_points.unwrap_compiled(model)
        dataloaders, datamodule = entry_points.split_datamodule(dataloaders, datamodule)
        model, path = entry_points.check_eval(self, fn, model, dataloaders, datamodule, ckpt_path)
        return self._launch(fn, model, {"eval": dataloaders, "datamodule": datamodule}, path, options)

    def _launch(
        self, fn: TrainerFn, model: Any, loaders: dict[str, Any], ckpt_path: str | None, options: dict[str, Any]
    ) -> Any:
        self._module = model  # the launcher copies results back into this process's Module
        self._datamodule = loaders.get("datamodule")
        self._ckpt_path = ckpt_path
        launcher = self._strategy.launcher
        try:
            if launcher is not None:
                self.run = None  # a stage that runs in other processes leaves no Run in this one
                return launcher.launch(self._run_stage, fn, model, loaders, ckpt_path, options, trainer=self)
            return self._run_stage(fn, model, loaders, ckpt_path, options)
        except KeyboardInterrupt:
            # Lightning's graceful Ctrl-C: the stage has already set the status to INTERRUPTED, run
            # the callbacks' on_exception and torn down; what is left is to end the script with 1.
            # Several processes keep the launchers' stop (every rank ends, the job exits 130): a
            # rank exiting 1 would read to the launcher as a failed rank, not an interrupted job.
            if self.world_size > 1:
                raise
            self._state.status = TrainerStatus.INTERRUPTED
            rank_zero_info("\nDetected KeyboardInterrupt, attempting graceful shutdown ...")
            raise SystemExit(1) from None

    def _run_stage(
        self, fn: TrainerFn, model: Any, loaders: dict[str, Any], ckpt_path: str | None, options: dict[str, Any]
    ) -> Any:
        """The per-rank body of an entry point; what ``strategy.launcher.launch`` runs on each rank."""
        self._module = model
        self._datamodule = loaders.get("datamodule")
        self._ckpt_path = ckpt_path
        self._state.fn, self._state.stage, self._state.status = fn, _FIRST_STAGE[fn], TrainerStatus.RUNNING
        self._callbacks = components.add_module_callbacks(self._callbacks, model)
        self.run = self._new_run(fn, model)
        return run_stage(self.run, loaders, ckpt_path, options)

    def _new_run(self, fn: TrainerFn, model: Any) -> Run:
        return Run(
            self,
            self.config,
            fn,
            model,
            self._strategy,
            hooks=HookRunner(self, self._callbacks, model, profiler=self._profiler),
            metrics=self._metrics,
            loops=(self.fit_loop, self.val_loop, self.test_loop, self.predict_loop),
            state=self._state,
            datamodule=self._datamodule,
            profiler=self._profiler,
        )

    def _current_run(self, action: str) -> Run:
        """The Run to read state from: this process's, or (after a stage ran in launched workers) one
        over the Module the launcher copied the results into."""
        if self.run is not None:
            return self.run
        if self._module is None:
            msg = f"Trainer.{action} needs a model: call it during or after fit/validate/test/predict."
            raise MisconfigurationError(msg)
        self.run = self._new_run(self._state.fn or TrainerFn.FITTING, self._module)
        self.run.optimizers = list(self._strategy.optimizers)
        return self.run

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
        meta-device copy. Returns a :class:`phalanx.planning.PlanReport`; ``print`` it for the table.

        Args:
            model: The Module ``fit`` would get.
            input_shape: One micro-batch per rank, e.g. ``(1, 2048)``, to estimate activations.
            input_dtype: Its dtype name (default ``int64`` after an ``nn.Embedding``, else ``float32``).
            device_memory: Memory of one device (``"80GiB"`` or bytes), to say whether it fits.
            optimizer: Optimizer kind; default: read from ``configure_optimizers``.

        Raises:
            MisconfigurationError: A bad model, optimizer or device memory, naming the fix.
        """
        from phalanx.trainer.plan import plan_run

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
        path = check_path(filepath, argument="Trainer.save_checkpoint(filepath=...)")
        checkpoint = checkpointing.dump_checkpoint(self._current_run("save_checkpoint"), weights_only=weights_only)
        self._strategy.save_checkpoint(checkpoint, path, storage_options=storage_options)
        self._strategy.barrier("Trainer.save_checkpoint")
