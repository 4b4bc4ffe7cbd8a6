"""One training step: forward, zero_grad, backward and optimizer step, in Lightning's order.

The step runs inside a closure handed to ``Module.optimizer_step`` -> ``optimizer.step`` ->
``strategy.optimizer_step`` -> ``precision.optimizer_step``: the precision decides when the closure
runs (loss scaling, LBFGS re-evaluation) and calls back into the Trainer between backward and the
update for ``on_before_optimizer_step`` and gradient clipping. Accumulation steps run the closure
directly under ``strategy.block_backward_sync()`` (DDP skips the gradient all-reduce there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.trainer.trainer import Trainer

__all__ = ["StepOptimizer", "TrainingStep", "run_automatic"]


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
        if type(output) is torch.Tensor:  # the common case, without the general checks' calls
            loss: torch.Tensor | None = output
            self.outputs = {"loss": output.detach()}
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
        return loss.detach()


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
