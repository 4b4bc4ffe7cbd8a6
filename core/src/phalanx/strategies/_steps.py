"""The step methods of a Strategy: training/validation/test/predict steps, backward, optimizer step.

They run the Module's code the way the strategy's wrapper needs (through the wrapper's
``__call__`` so its hooks fire) and route numerics through the Precision. Kept apart from
``strategy.py`` so the lifecycle contract there stays readable.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim import Optimizer

from phalanx.precision.precision import Precision
from phalanx.utilities.wrappers import call_through_wrapper

__all__ = ["StrategySteps"]


class StrategySteps:
    """Step methods mixed into :class:`~phalanx.strategies.strategy.Strategy`."""

    #: Whether this strategy's step methods (``training_step``, ``backward``, ``optimizer_step``...)
    #: only pass the step through (calling the Module through :attr:`forward_wrapper`), so the
    #: Trainer may run ``optimizer.step(closure)`` itself (docs/trainer.md, "the step pipeline").
    #: Never inherited: a subclass takes the layered step unless its own class body sets it True.
    passes_step_through: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "passes_step_through" not in cls.__dict__:
            cls.passes_step_through = False

    @property
    def training_step_runs_backward(self) -> bool:
        """Whether ``training_step`` already ran backward (a pipeline schedule does forward and
        backward per microbatch). Then the Trainer zeroes gradients *before* the step and does not
        backpropagate the loss it returns; ``on_before_backward`` / ``on_after_backward`` still run."""
        return False

    # Provided by Strategy.
    _module: nn.Module | None
    model: nn.Module | None
    precision_plugin: Precision

    def require_module(self) -> nn.Module:
        """See ``Strategy.require_module``."""
        raise NotImplementedError

    def backward(
        self,
        closure_loss: torch.Tensor,
        optimizer: Optimizer | None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Backpropagate through the precision; returns the (unscaled) loss."""
        module = self._module
        precision = self.precision_plugin  # a property: read once per step, not three times
        self.pre_backward(closure_loss)
        closure_loss = precision.pre_backward(closure_loss, module)
        precision.backward(closure_loss, module, optimizer, *args, **kwargs)
        closure_loss = precision.post_backward(closure_loss, module)
        self.post_backward(closure_loss)
        return closure_loss

    def pre_backward(self, closure_loss: torch.Tensor) -> None:
        """Runs before the precision's backward (DDP prepares its reducer here)."""

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        """Runs after the precision's backward."""

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """Step ``optimizer`` through the precision (which runs the closure first).

        Args:
            optimizer: The optimizer to step.
            closure: Runs forward and backward, returning the loss.
            model: The Module whose trainer gets the pre-step slot; defaults to :attr:`module`.
            **kwargs: Passed to ``optimizer.step``.
        """
        target = model if model is not None else self._module
        return self.precision_plugin.optimizer_step(optimizer, target, closure, **kwargs)

    def block_backward_sync(self) -> AbstractContextManager[Any]:
        """Context for accumulation steps that must not synchronise gradients (DDP: ``no_sync``)."""
        return nullcontext()

    @property
    def forward_wrapper(self) -> nn.Module | None:
        """The module whose ``__call__`` must run the Module's steps, or None to call them directly.

        The default is the wrapper (:attr:`model`) when there is one. Steps are run by calling it,
        with ``forward`` redirected to the step, so the wrapper's hooks run around the step (DDP's
        gradient reducer, DeepSpeed's engine). FSDP2 returns the Module itself: it is its own wrapper.
        """
        model = self.model
        return None if model is None or model is self._module else model

    def _step(self, name: str, *args: Any, **kwargs: Any) -> Any:
        module = self.require_module()
        wrapper = self.forward_wrapper
        if wrapper is None:
            return getattr(module, name)(*args, **kwargs)
        return call_through_wrapper(wrapper, module, name, *args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run the Module's ``training_step`` inside the precision's training context."""
        with self.precision_plugin.train_step_context():
            return self._step("training_step", *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run the Module's ``validation_step`` inside the precision's validation context."""
        with self.precision_plugin.val_step_context():
            return self._step("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run the Module's ``test_step`` inside the precision's test context."""
        with self.precision_plugin.test_step_context():
            return self._step("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run the Module's ``predict_step`` inside the precision's predict context."""
        with self.precision_plugin.predict_step_context():
            return self._step("predict_step", *args, **kwargs)
