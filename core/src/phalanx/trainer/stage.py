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
from phalanx.module import Module
from phalanx.trainer import checkpointing
from phalanx.trainer.arguments import no_training_data
from phalanx.trainer.data import as_loader_list
from phalanx.trainer.step import StepOptimizer
from phalanx.trainer_view import TrainerFn
from phalanx.utilities.model_helpers import is_overridden

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["run_stage"]

_DATA_HOOK = {
    TrainerFn.VALIDATING: "val_dataloader",
    TrainerFn.TESTING: "test_dataloader",
    TrainerFn.PREDICTING: "predict_dataloader",
}


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


def _resolve_loaders(run: Run, given: Any, hook: str, argument: str, *, multiple: bool) -> list[Any]:
    if given is None:
        if not is_overridden(hook, type(run.module), Module):
            return []
        given = run.hooks.call_module(hook)
        if given is None:
            return []
    return as_loader_list(given, argument=argument, multiple=multiple)


def _setup_data(run: Run, loaders: dict[str, Any]) -> None:
    fn, module, config = run.fn, run.module, run.config
    if fn is TrainerFn.FITTING:
        train = _resolve_loaders(run, loaders.get("train"), "train_dataloader", "train_dataloaders", multiple=False)
        if not train:
            raise no_training_data(module)
        run.fit_loop.setup(run, train[0])
        val: list[Any] = []
        if config.limit_val_batches != 0:
            val = _resolve_loaders(run, loaders.get("val"), "val_dataloader", "val_dataloaders", multiple=True)
        if val and not is_overridden("validation_step", type(module), Module):
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
    resolved = _resolve_loaders(run, loaders.get("eval"), hook, "dataloaders", multiple=True)
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
    run.hooks.call("teardown", stage)
    trainer = run.trainer
    for logger in trainer.loggers if trainer.is_global_zero else []:
        logger.finalize(status)
    run.strategy.teardown()


def run_stage(run: Run, loaders: dict[str, Any], ckpt_path: str | None, options: dict[str, Any]) -> Any:
    """Run one entry point in this process (what the launcher calls on every rank)."""
    trainer, strategy, module, hooks, fn = run.trainer, run.strategy, run.module, run.hooks, run.fn
    module.trainer = trainer
    strategy.connect(module)
    stage = fn.value
    try:
        with _deterministic(run.config.deterministic):
            strategy.setup_environment()
            ckpt_path = strategy.broadcast(ckpt_path)
            for logger in trainer.loggers if trainer.is_global_zero else []:
                logger.save()  # creates the run directory so the next run picks the next version
            if trainer.local_rank == 0:
                hooks.call_module("prepare_data")
            strategy.barrier("prepare_data")
            hooks.call("setup", stage)
            if is_overridden("configure_model", type(module), Module):
                with strategy.tensor_init_context(), strategy.model_sharded_context():
                    hooks.call_module("configure_model")
            _setup_data(run, loaders)
            strategy.setup(trainer)
            run.optimizers = list(strategy.optimizers)
            run.step_optimizers = [StepOptimizer(optimizer, run) for optimizer in run.optimizers]
            if fn is TrainerFn.FITTING:
                _check_optimizers(run)
            if ckpt_path is not None:
                # One restore path, after setup: sharded strategies load straight into their shards.
                checkpointing.restore(run, ckpt_path)
            result = _run_loop(run, options)
    except BaseException as exception:
        run.state.status = "interrupted"
        hooks.call_callbacks("on_exception", exception)
        strategy.on_exception(exception)
        with contextlib.suppress(Exception):
            _teardown(run, stage, "failed")
        raise
    run.state.status = "finished"
    _teardown(run, stage, "success")
    if fn is TrainerFn.FITTING:
        run.fit_loop.preemption.exit_if_preempted(run)  # SystemExit(143) after a preemption checkpoint
    run.state.stage = None
    return result


def _run_loop(run: Run, options: dict[str, Any]) -> Any:
    fn = run.fn
    if fn is TrainerFn.FITTING:
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
