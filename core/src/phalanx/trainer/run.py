"""The body of fit/validate/test/predict as it runs in each process.

``Trainer.fit`` & co. validate their inputs in the calling process, then hand :func:`run_stage` to
the strategy's launcher (if any), which runs it once per rank. Everything here happens inside a
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
from phalanx.trainer import checkpointing
from phalanx.trainer.data import as_loader_list
from phalanx.trainer.optimization import StepOptimizer
from phalanx.trainer.state import RunningStage, TrainerFn

if TYPE_CHECKING:
    from phalanx.trainer.trainer import Trainer

__all__ = ["is_overridden", "run_stage"]

_FIRST_STAGE = {
    TrainerFn.FITTING: RunningStage.TRAINING,
    TrainerFn.VALIDATING: RunningStage.VALIDATING,
    TrainerFn.TESTING: RunningStage.TESTING,
    TrainerFn.PREDICTING: RunningStage.PREDICTING,
}
_DATA_HOOK = {
    TrainerFn.VALIDATING: "val_dataloader",
    TrainerFn.TESTING: "test_dataloader",
    TrainerFn.PREDICTING: "predict_dataloader",
}


def is_overridden(module: Any, name: str) -> bool:
    """Whether ``module``'s class defines ``name`` itself rather than inheriting phalanx's default."""
    from phalanx.module import Module

    return getattr(type(module), name, None) is not getattr(Module, name, None)


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


def _resolve_loaders(
    trainer: Trainer, module: Any, given: Any, hook: str, argument: str, *, multiple: bool
) -> list[Any]:
    if given is None:
        if not is_overridden(module, hook):
            return []
        trainer._current_fx = hook
        given = getattr(module, hook)()
        trainer._current_fx = None
        if given is None:
            return []
    return as_loader_list(given, argument=argument, multiple=multiple)


def _setup_data(trainer: Trainer, fn: TrainerFn, module: Any, loaders: dict[str, Any]) -> None:
    if fn is TrainerFn.FITTING:
        train = _resolve_loaders(
            trainer, module, loaders.get("train"), "train_dataloader", "train_dataloaders", multiple=False
        )
        if not train:
            raise MisconfigurationError(
                f"fit() got no training data: pass train_dataloaders=DataLoader(...) or define "
                f"{type(module).__qualname__}.train_dataloader()."
            )
        trainer.fit_loop.setup(train[0])
        val: list[Any] = []
        if trainer.limit_val_batches != 0:
            val = _resolve_loaders(
                trainer, module, loaders.get("val"), "val_dataloader", "val_dataloaders", multiple=True
            )
        if val and not is_overridden(module, "validation_step"):
            warnings.warn(
                f"Validation dataloaders were given but {type(module).__qualname__} has no validation_step; "
                "validation is skipped. Define validation_step to validate during fit.",
                stacklevel=4,
            )
            val = []
        trainer.val_loop.setup(val)
        trainer._has_validation = sum(trainer.val_loop.num_batches) > 0
        return
    hook = _DATA_HOOK[fn]
    resolved = _resolve_loaders(trainer, module, loaders.get("eval"), hook, "dataloaders", multiple=True)
    if not resolved:
        raise MisconfigurationError(
            f"{fn.value}() got no data: pass dataloaders=DataLoader(...) or define {type(module).__qualname__}.{hook}()."
        )
    loop = {TrainerFn.VALIDATING: trainer.val_loop, TrainerFn.TESTING: trainer.test_loop}.get(fn, trainer.predict_loop)
    loop.setup(resolved)


def _check_optimizers(trainer: Trainer, module: Any) -> None:
    count = len(trainer._optimizers)
    if module.automatic_optimization and count != 1:
        what = "no optimizer" if count == 0 else f"{count} optimizers"
        msg = (
            f"{type(module).__qualname__}.configure_optimizers returned {what}; automatic optimization needs exactly "
            "one. Return one optimizer, or set self.automatic_optimization = False and step them in training_step."
        )
        raise MisconfigurationError(msg)
    if not module.automatic_optimization and trainer.gradient_clip_val:
        msg = (
            f"Trainer(gradient_clip_val={trainer.gradient_clip_val}) is not applied with manual optimization; "
            "remove it and call self.clip_gradients(optimizer, ...) in training_step."
        )
        raise MisconfigurationError(msg)


def _teardown(trainer: Trainer, module: Any, stage: str, status: str) -> None:
    for callback in trainer.callbacks:
        callback.teardown(trainer, module, stage)
    trainer._current_fx = "teardown"
    module.teardown(stage)
    trainer._current_fx = None
    for logger in trainer.loggers if trainer.is_global_zero else []:
        logger.finalize(status)
    trainer.strategy.teardown()


def run_stage(
    trainer: Trainer,
    fn: TrainerFn,
    module: Any,
    loaders: dict[str, Any],
    ckpt_path: str | None,
    options: dict[str, Any],
) -> Any:
    """Run one entry point in this process (what the launcher calls on every rank)."""
    strategy = trainer.strategy
    trainer.state.fn, trainer.state.stage, trainer.state.status = fn, _FIRST_STAGE[fn], "running"
    trainer.should_stop = False
    trainer._module = module
    module.trainer = trainer
    strategy.connect(module)
    trainer._build_hook_cache()
    stage = fn.value
    try:
        with _deterministic(trainer.deterministic):
            strategy.setup_environment()
            ckpt_path = strategy.broadcast(ckpt_path)
            for logger in trainer.loggers if trainer.is_global_zero else []:
                logger.save()  # creates the run directory so the next run picks the next version
            if trainer.local_rank == 0:
                trainer._current_fx = "prepare_data"
                module.prepare_data()
            strategy.barrier("prepare_data")
            for callback in trainer.callbacks:
                callback.setup(trainer, module, stage)
            trainer._current_fx = "setup"
            module.setup(stage)
            if is_overridden(module, "configure_model"):
                trainer._current_fx = "configure_model"
                with strategy.tensor_init_context(), strategy.model_sharded_context():
                    module.configure_model()
            trainer._current_fx = None
            _setup_data(trainer, fn, module, loaders)
            strategy.setup(trainer)
            trainer._optimizers = list(strategy.optimizers)
            trainer._wrapped_optimizers = [StepOptimizer(opt, trainer) for opt in trainer._optimizers]
            if fn is TrainerFn.FITTING:
                _check_optimizers(trainer, module)
            if ckpt_path is not None:
                # One restore path, after setup: sharded strategies load straight into their shards.
                checkpointing.restore(trainer, ckpt_path, fn=stage, fitting=fn is TrainerFn.FITTING)
            result = _run_loop(trainer, fn, options)
    except BaseException as exception:
        trainer.state.status = "interrupted"
        for callback in trainer.callbacks:
            callback.on_exception(trainer, module, exception)
        strategy.on_exception(exception)
        with contextlib.suppress(Exception):
            _teardown(trainer, module, stage, "failed")
        raise
    trainer.state.status = "finished"
    _teardown(trainer, module, stage, "success")
    if fn is TrainerFn.FITTING:
        trainer.fit_loop.preemption.exit_if_preempted()  # SystemExit(143) after a preemption checkpoint
    trainer.state.stage = None
    return result


def _run_loop(trainer: Trainer, fn: TrainerFn, options: dict[str, Any]) -> Any:
    if fn is TrainerFn.FITTING:
        trainer._call_hooks("on_fit_start")
        with trainer.fit_loop.preemption.armed():
            trainer.fit_loop.run()
        trainer._call_hooks("on_fit_end")
        return None
    if fn is TrainerFn.PREDICTING:
        return trainer.predict_loop.run(return_predictions=options.get("return_predictions", True))
    loop = trainer.val_loop if fn is TrainerFn.VALIDATING else trainer.test_loop
    results = loop.run()
    if options.get("verbose", True) and trainer.is_global_zero:
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
