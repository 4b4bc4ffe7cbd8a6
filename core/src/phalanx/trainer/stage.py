"""The body of fit/validate/test/predict as it runs in each process.

``Trainer.fit`` & co. validate their inputs in the calling process, then hand the stage to the
strategy's launcher (if any), which runs it once per rank: the Trainer makes the stage's
:class:`~phalanx.trainer.run.Run` and calls :func:`run_stage` with it. Everything here happens inside a
rank: process group setup, hooks, dataloaders, checkpoint restore, the loop and teardown. The order
follows Lightning's so hooks observe the same state they would there.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from phalanx.errors import MisconfigurationError
from phalanx.hparams import hparams_to_log
from phalanx.module import Module
from phalanx.trainer import checkpointing, flight_recorder
from phalanx.trainer.data import resolve_loaders
from phalanx.trainer.entry_points import no_training_data
from phalanx.trainer.step import StepOptimizer
from phalanx.trainer.watchdog import Watchdog
from phalanx.trainer_view import TrainerFn, TrainerStatus
from phalanx.utilities.model_helpers import is_overridden
from phalanx.utilities.rank_zero import rank_zero_only
from phalanx.utilities.seed import reset_seed

if TYPE_CHECKING:
    from phalanx.trainer.config import TrainerConfig
    from phalanx.trainer.run import Run

__all__ = ["run_stage"]

_DATA_HOOK = {
    TrainerFn.VALIDATING: "val_dataloader",
    TrainerFn.TESTING: "test_dataloader",
    TrainerFn.PREDICTING: "predict_dataloader",
}


@contextlib.contextmanager
def _torch_flags(config: TrainerConfig) -> Iterator[None]:
    """``Trainer(deterministic=, benchmark=, detect_anomaly=)`` for the run, restored after."""
    previous_benchmark = torch.backends.cudnn.benchmark
    if config.benchmark is not None:
        torch.backends.cudnn.benchmark = config.benchmark
    try:
        with _deterministic(config.deterministic), torch.autograd.set_detect_anomaly(config.detect_anomaly):
            yield
    finally:
        torch.backends.cudnn.benchmark = previous_benchmark


@contextlib.contextmanager
def _deterministic(mode: bool | str) -> Iterator[None]:
    """Apply ``Trainer(deterministic=...)`` for the run and restore the previous settings after."""
    if mode is False:
        yield
        return
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    previous_cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    had_env = "CUBLAS_WORKSPACE_CONFIG" in os.environ
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=mode == "warn")
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous_cudnn
        if not had_env:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def _setup_data(run: Run, loaders: dict[str, Any]) -> None:
    fn, module, config = run.fn, run.module, run.config
    if fn is TrainerFn.FITTING:
        run.train_loader_given = loaders.get("train") is not None

        def resolve_val() -> list[Any]:
            if config.limit_val_batches == 0:
                return []
            return resolve_loaders(run, loaders.get("val"), "val_dataloader", "val_dataloaders", multiple=True)

        # Asked for in Lightning's order: the validation loaders first when the sanity check will use them.
        sanity_first = config.num_sanity_val_steps != 0
        val: list[Any] = resolve_val() if sanity_first else []
        train = resolve_loaders(run, loaders.get("train"), "train_dataloader", "train_dataloaders", multiple=False)
        if not train:
            raise no_training_data(module)
        run.fit_loop.setup(run, train[0])
        if not sanity_first:
            val = resolve_val()
        if val and not is_overridden("validation_step", module, Module):  # None set on the instance: no step
            warnings.warn(
                f"Validation dataloaders were given but {type(module).__qualname__} has no validation_step; "
                "validation is skipped. Define validation_step to validate during fit.",
                stacklevel=4,
            )
            val = []
        run.val_loop.setup(run, val)
        run.has_validation = sum(run.val_loop.num_batches) > 0
        return
    hook = _DATA_HOOK[fn]
    resolved = resolve_loaders(run, loaders.get("eval"), hook, "dataloaders", multiple=True)
    if not resolved:
        raise MisconfigurationError(
            f"{fn.value}() got no data: pass dataloaders=DataLoader(...) or define {type(module).__qualname__}.{hook}()."
        )
    loop = {TrainerFn.VALIDATING: run.val_loop, TrainerFn.TESTING: run.test_loop}.get(fn, run.predict_loop)
    loop.setup(run, resolved)


def _check_optimizers(run: Run) -> None:
    module, clip_val = run.module, run.config.gradient_clip_val
    count = len(run.optimizers)
    if module.automatic_optimization and count != 1:
        what = "no optimizer" if count == 0 else f"{count} optimizers"
        msg = (
            f"{type(module).__qualname__}.configure_optimizers returned {what}; automatic optimization needs exactly "
            "one. Return one optimizer, or set self.automatic_optimization = False and step them in training_step."
        )
        raise MisconfigurationError(msg)
    if not module.automatic_optimization and clip_val:
        msg = (
            f"Trainer(gradient_clip_val={clip_val}) is not applied with manual optimization; "
            "remove it and call self.clip_gradients(optimizer, ...) in training_step."
        )
        raise MisconfigurationError(msg)


def _teardown(run: Run, stage: str, status: str) -> None:
    if run.datamodule is not None:
        run.datamodule.teardown(stage=stage)  # by keyword, as Lightning calls it
    run.hooks.call("teardown", stage)
    trainer = run.trainer
    for logger in trainer.loggers:  # every rank, as Lightning: the loggers act on rank 0 (rank_zero_only)
        logger.finalize(status)
    profiler = run.profiler
    try:
        if profiler is not None:
            profiler.describe()
    finally:
        if profiler is not None:
            profiler.teardown(stage)
        run.strategy.precision_plugin.connect_before_optimizer_step(None)  # the stage's slot ends with it
        run.strategy.teardown()


def _prepare_data(run: Run) -> None:
    """``prepare_data`` of the DataModule and the Module, once per machine (or once per job), then a barrier."""
    trainer, datamodule = run.trainer, run.datamodule
    if datamodule is not None:
        first = trainer.local_rank == 0 if datamodule.prepare_data_per_node else trainer.is_global_zero
        if first:
            datamodule.prepare_data()
    module = run.module
    first = trainer.local_rank == 0 if getattr(module, "prepare_data_per_node", True) else trainer.is_global_zero
    if first:
        run.hooks.call_module("prepare_data")
    run.strategy.barrier("prepare_data")


def _log_hyperparameters(run: Run) -> None:
    """Send the Module's (and DataModule's) saved hyperparameters to the loggers (on every rank, as Lightning).

    Raises:
        MisconfigurationError: The Module and the DataModule saved the same name with different values.
    """
    trainer = run.trainer
    if not trainer.loggers or not run.config.enable_autolog_hparams:
        return
    params = hparams_to_log(run.module, run.datamodule)
    for logger in trainer.loggers:
        if params:
            logger.log_hyperparams(params)
        logger.log_graph(run.module)  # as Lightning: with or without hyperparameters (a no-op unless asked)
        logger.save()


def run_stage(run: Run, loaders: dict[str, Any], ckpt_path: str | None, options: dict[str, Any]) -> Any:
    """Run one entry point in this process (what the launcher calls on every rank)."""
    trainer, strategy, module, hooks, fn = run.trainer, run.strategy, run.module, run.hooks, run.fn
    module.trainer = trainer
    datamodule = run.datamodule
    if datamodule is not None:
        datamodule.trainer = trainer
    strategy.connect(module)
    stage = fn.value
    try:
        with _torch_flags(run.config):
            # Before the process group exists: the hang report reads what the recorder keeps.
            flight_recorder.enable(world_size=trainer.world_size, hang_report=run.config.hang_report_after is not None)
            strategy.setup_environment()
            _start_watchdog(run)
            rank_zero_only.rank = trainer.global_rank  # rank_zero_* helpers now know this process's rank
            if trainer.world_size > 1:
                reset_seed()  # each rank starts from the seed_everything() seed, as Lightning's ranks do
            ckpt_path = strategy.broadcast(ckpt_path)
            if run.profiler is not None:
                local_rank = trainer.local_rank if trainer.world_size > 1 else None  # one process: no rank suffix
                run.profiler.setup(stage=stage, local_rank=local_rank, log_dir=trainer.log_dir)
            _prepare_data(run)
            # The loggers' runs exist before the setup hooks, as in Lightning: a checkpoint directory
            # resolved in a setup hook is the run's (W&B's run id, TensorBoard's version folder).
            for logger in trainer.loggers if trainer.is_global_zero else []:
                getattr(logger, "experiment", None)
            if datamodule is not None:
                datamodule.setup(stage=stage)
            hooks.call("setup", stage)
            for name in ("configure_sharded_model", "configure_model"):  # the old name first, as Lightning
                if is_overridden(name, type(module), Module):
                    with strategy.tensor_init_context(), strategy.model_sharded_context():
                        hooks.call_module(name)
            _setup_data(run, loaders)
            strategy.setup(trainer)
            # The slot between backward and the optimizer step is the Trainer's: handed to the
            # precision explicitly for this stage (taken back in _teardown).
            strategy.precision_plugin.connect_before_optimizer_step(run.before_optimizer_step)
            run.optimizers = list(strategy.optimizers)
            run.step_optimizers = [StepOptimizer(optimizer, run) for optimizer in run.optimizers]
            # The loggers' first call comes after the setup hooks, as in Lightning (a setup hook may
            # still configure them); it creates the run directory so the next run picks the next version.
            for logger in trainer.loggers:  # every rank, as Lightning: the loggers act on rank 0
                logger.save()
            if fn is TrainerFn.FITTING:
                _check_optimizers(run)
            if ckpt_path is not None:
                # One restore path, after setup: sharded strategies load straight into their shards.
                checkpointing.restore(run, ckpt_path)
            result = _run_loop(run, options)
    except BaseException as exception:
        _stop_watchdog(run)
        run.state.status = TrainerStatus.INTERRUPTED
        hooks.call_callbacks("on_exception", exception)
        if datamodule is not None:
            datamodule.on_exception(exception)
        strategy.on_exception(exception)
        with contextlib.suppress(Exception):
            _teardown(run, stage, "failed")
        raise
    _stop_watchdog(run)
    run.state.status = TrainerStatus.FINISHED
    _teardown(run, stage, "success")
    if fn is TrainerFn.FITTING:
        run.fit_loop.preemption.exit_if_preempted(run)  # SystemExit(143) after a preemption checkpoint
    run.state.stage = None
    return result


def _start_watchdog(run: Run) -> None:
    """In a distributed stage, start the hang watchdog (:mod:`phalanx.trainer.watchdog`), unless
    ``Trainer(hang_report_after=None)`` turned it off."""
    strategy = run.strategy
    if strategy.world_size > 1 and run.config.hang_report_after is not None:
        run.watchdog = Watchdog(run, report_after=run.config.hang_report_after, store=strategy.rendezvous_store)
        run.watchdog.start()


def _stop_watchdog(run: Run) -> None:
    watchdog, run.watchdog = run.watchdog, None
    if watchdog is not None:
        watchdog.stop()


def _run_loop(run: Run, options: dict[str, Any]) -> Any:
    fn = run.fn
    if fn is TrainerFn.FITTING:
        _log_hyperparameters(run)
        run.hooks.call("on_fit_start")
        with run.fit_loop.preemption.armed(run):
            run.fit_loop.run(run)
        run.hooks.call("on_fit_end")
        return None
    if fn is TrainerFn.PREDICTING:
        return run.predict_loop.run(run, return_predictions=options.get("return_predictions", True))
    loop = run.val_loop if fn is TrainerFn.VALIDATING else run.test_loop
    results = loop.run(run)
    if options.get("verbose", True) and run.trainer.is_global_zero:
        _print_results(fn.value, results)
    return results


def _print_results(stage: str, results: list[dict[str, float]]) -> None:
    rows = [
        (f"{key}" + (f" (dataloader {i})" if len(results) > 1 else ""), value)
        for i, r in enumerate(results)
        for key, value in sorted(r.items())
    ]
    if not rows:
        return
    width = max(len(name) for name, _ in rows)
    print(f"{stage} results")
    for name, value in rows:
        print(f"  {name:<{width}}  {value:.6g}")
