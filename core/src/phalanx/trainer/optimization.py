"""One training step: forward, zero_grad, backward and optimizer step, in Lightning's order.

The step runs inside a closure handed to ``Module.optimizer_step`` -> ``optimizer.step`` ->
``strategy.optimizer_step`` -> ``precision.optimizer_step``: the precision decides when the closure
runs (loss scaling, LBFGS re-evaluation) and calls back into the Trainer between backward and the
update for ``on_before_optimizer_step`` and gradient clipping. Accumulation steps run the closure
directly under ``strategy.block_backward_sync()`` (DDP skips the gradient all-reduce there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies._redirect import call_through_wrapper
from phalanx.strategies._steps import StrategySteps

if TYPE_CHECKING:
    from phalanx.trainer.trainer import Trainer

__all__ = ["StepOptimizer", "TrainingStep", "direct_step", "run_automatic", "run_direct"]


class StepOptimizer:
    """What ``Module.optimizers()`` and ``Module.optimizer_step`` see: an optimizer that steps
    through the strategy, so precision scaling and strategy logic apply to manual calls too."""

    def __init__(self, optimizer: Optimizer, trainer: Trainer) -> None:
        self.optimizer = optimizer
        self._trainer = trainer

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        """Step through ``strategy.optimizer_step``; counts an optimizer step in manual optimization."""
        trainer = self._trainer
        if closure is None:
            closure = _noop
        result = trainer._strategy.optimizer_step(self.optimizer, closure, trainer._module, **kwargs)
        if not trainer._module.automatic_optimization:
            trainer.fit_loop.global_step += 1
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset gradients."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"StepOptimizer({self.optimizer!r})"


def _noop() -> None:
    return None


def _loss_of(output: Any) -> torch.Tensor | None:
    if output is None or type(output) is torch.Tensor or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        if "loss" not in output:
            msg = (
                f"training_step returned a dict without a 'loss' key (keys: {sorted(output)}); add "
                "'loss': <scalar tensor>, or return the loss tensor itself."
            )
            raise MisconfigurationError(msg)
        return output["loss"]  # type: ignore[no-any-return]
    msg = (
        f"training_step returned {type(output).__name__}; return the loss tensor, a dict with a 'loss' key, "
        "or None to skip the batch."
    )
    raise MisconfigurationError(msg)


def _detached_outputs(output: Any, loss: torch.Tensor | None) -> Any:
    if loss is None:
        return output
    if output is loss:
        return {"loss": loss.detach()}
    return {**output, "loss": loss.detach()}


class TrainingStep:
    """The closure for one batch; records the step output for ``on_train_batch_end``."""

    __slots__ = ("_trainer", "batch", "batch_idx", "divisor", "optimizer", "outputs", "ran", "zero_grad")

    def __init__(
        self, trainer: Trainer, batch: Any, batch_idx: int, optimizer: Optimizer, *, zero_grad: bool, divisor: int
    ) -> None:
        self._trainer = trainer
        self.batch = batch
        self.batch_idx = batch_idx
        self.optimizer = optimizer
        self.zero_grad = zero_grad
        self.divisor = divisor
        self.outputs: Any = None
        self.ran = False

    def __call__(self) -> torch.Tensor | None:
        trainer = self._trainer
        module = trainer._module
        strategy = trainer._strategy
        trainer._current_fx = "training_step"
        output = strategy.training_step(self.batch, self.batch_idx)
        detached = None
        if type(output) is torch.Tensor:  # the common case, without the general checks' calls
            loss: torch.Tensor | None = output
            detached = output.detach()
            self.outputs = {"loss": detached}
        else:
            loss = _loss_of(output)
            self.outputs = _detached_outputs(output, loss)
        self.ran = True
        live = trainer._live_hooks
        if self.zero_grad:
            if "on_before_zero_grad" in live:
                trainer._call_hooks("on_before_zero_grad", self.optimizer)
            module.optimizer_zero_grad(trainer.fit_loop.epoch, self.batch_idx, self.optimizer)
        if loss is None:
            return None
        if self.divisor > 1:
            loss = loss / self.divisor
        if "on_before_backward" in live:
            trainer._call_hooks("on_before_backward", loss)
        strategy.backward(loss, self.optimizer)
        if "on_after_backward" in live:
            trainer._call_hooks("on_after_backward")
        return detached if self.divisor == 1 and detached is not None else loss.detach()


def run_automatic(trainer: Trainer, batch: Any, batch_idx: int, *, step_now: bool) -> Any:
    """Run one batch with automatic optimization; returns the step outputs.

    Args:
        trainer: The Trainer.
        batch: The batch, already on the device.
        batch_idx: Index of the batch in the epoch.
        step_now: Whether this batch closes an accumulation window (the optimizer steps).
    """
    strategy = trainer._strategy
    accumulate = trainer.accumulate_grad_batches
    handles = strategy.handles_gradient_accumulation
    closure = TrainingStep(
        trainer,
        batch,
        batch_idx,
        trainer._optimizers[0],
        zero_grad=batch_idx % accumulate == 0,
        divisor=1 if handles else accumulate,
    )
    if step_now or handles:
        trainer._current_fx = "optimizer_step"
        trainer._module.optimizer_step(trainer.fit_loop.epoch, batch_idx, trainer._wrapped_optimizers[0], closure)
        if not closure.ran:
            msg = (
                "Module.optimizer_step was overridden without running the closure; call "
                "optimizer.step(closure=optimizer_closure) so training_step and backward happen."
            )
            raise MisconfigurationError(msg)
    else:
        with strategy.block_backward_sync():
            closure()
    return closure.outputs


#: The layers between the fit loop and ``optimizer.step`` that only pass a step through when they
#: are at their defaults: the strategy's and the precision's step methods, the Module's step hooks.
_STRATEGY_STEP_METHODS = ("optimizer_step", "backward", "pre_backward", "post_backward", "training_step", "_step")
_PRECISION_STEP_METHODS = (
    "optimizer_step",
    "_wrap_closure",
    "_after_closure",
    "backward",
    "pre_backward",
    "post_backward",
    "train_step_context",
    "forward_context",
)
_MODULE_STEP_METHODS = ("optimizer_step", "optimizer_zero_grad")
_STEP_HOOKS = ("on_before_zero_grad", "on_before_backward", "on_after_backward", "on_before_optimizer_step")
_NOT_RUN: Any = object()  # run_direct's outputs until the closure has run


def _at_default(obj: Any, base: type, names: tuple[str, ...]) -> bool:
    cls = type(obj)
    return all(getattr(cls, name) is getattr(base, name) and name not in vars(obj) for name in names)


def direct_step(trainer: Trainer) -> Callable[..., Any] | None:
    """What :func:`run_direct` calls for ``training_step`` in this fit, or None for the layered step.

    Not None when every layer of the step would only pass it through: automatic optimization
    without accumulation or gradient clipping, no step hook with anything to call, the strategy's
    and the precision's step methods inherited unchanged (so 32-true), and the Module's
    ``optimizer_step`` / ``optimizer_zero_grad`` not overridden. Then the step is the Module's
    ``training_step``, called through the strategy's ``forward_wrapper`` when it has one (DDP's
    wrapper, an FSDP2 module) exactly as the layered step calls it. Decided once, when training
    starts; anything customised keeps the layered path.
    """
    from phalanx.module import Module

    strategy = trainer._strategy
    module = trainer._module
    precision = strategy.precision_plugin
    direct = (
        module is not None
        and module.automatic_optimization
        and trainer.accumulate_grad_batches == 1
        and not trainer.gradient_clip_val
        and not trainer._custom_clipping
        and trainer._live_hooks.isdisjoint(_STEP_HOOKS)
        and isinstance(strategy, StrategySteps)
        and _at_default(strategy, StrategySteps, _STRATEGY_STEP_METHODS)
        and isinstance(precision, Precision)
        and _at_default(precision, Precision, _PRECISION_STEP_METHODS)
        and isinstance(module, Module)
        and _at_default(module, Module, _MODULE_STEP_METHODS)
    )
    if not direct:
        return None
    wrapper = strategy.forward_wrapper
    if wrapper is None:
        return module.training_step  # type: ignore[union-attr]
    return partial(call_through_wrapper, wrapper, module, "training_step")


def run_direct(trainer: Trainer, step: Callable[..., Any], batch: Any, batch_idx: int) -> Any:
    """:func:`run_automatic` with the pass-through layers left out (see :func:`direct_step`).

    The same calls in the same order, as Lightning makes them: ``optimizer.step(closure)``, and in
    the closure ``training_step``, ``optimizer.zero_grad()``, ``loss.backward()``. The per-step
    call-count test in core/tests holds the fit loop to this path's cost.
    """
    optimizer = trainer._optimizers[0]
    outputs: Any = _NOT_RUN

    def closure() -> torch.Tensor | None:
        nonlocal outputs
        output = step(batch, batch_idx)
        if type(output) is torch.Tensor:
            detached = output.detach()
            outputs = {"loss": detached}
            optimizer.zero_grad()
            output.backward()
            return detached
        loss = _loss_of(output)
        outputs = _detached_outputs(output, loss)
        optimizer.zero_grad()
        if loss is None:
            return None
        loss.backward()
        return loss.detach()

    trainer._current_fx = "training_step"
    optimizer.step(closure=closure)  # type: ignore[arg-type]  # torch's stub says float; a tensor is what it returns
    if outputs is _NOT_RUN:
        msg = (
            f"{type(optimizer).__name__}.step() returned without calling its closure, so training_step and "
            "backward never ran; an optimizer used with automatic optimization must call closure() in step()."
        )
        raise MisconfigurationError(msg)
    return outputs
