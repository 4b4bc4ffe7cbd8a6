"""The step pipeline: one training step, forward, zero_grad, backward and optimizer step, in
Lightning's order. Read this file top to bottom to know what a step does.

There are two paths, chosen once per fit by :func:`direct_step`:

**The layered step** (:func:`run_automatic`): every layer gets its say. The step runs inside a
closure (:class:`TrainingStep`) handed to ``Module.optimizer_step`` -> ``optimizer.step`` (a
:class:`StepOptimizer`) -> ``strategy.optimizer_step`` -> ``precision.optimizer_step``. The
precision decides when the closure runs (loss scaling, LBFGS re-evaluation) and calls
``run.before_optimizer_step`` between backward and the update, for ``on_before_optimizer_step``
and gradient clipping. The closure runs ``strategy.training_step`` (through the strategy's wrapper
and the precision's context), ``on_before_zero_grad`` / ``optimizer_zero_grad`` at the start of an
accumulation window, ``on_before_backward``, ``strategy.backward`` (through the precision),
``on_after_backward``. Accumulation steps run the closure directly under
``strategy.block_backward_sync()`` (DDP skips the gradient all-reduce there).

**The direct step** (:func:`run_direct`): when every layer only passes the step through, the same
calls in the same order without the layers: ``optimizer.step(closure)`` with ``training_step``
(through the strategy's wrapper, so DDP's and FSDP2's hooks fire), ``zero_grad`` and ``backward``
in the closure. Strategies and precisions *declare* that their step is a pass-through with the
class attribute ``passes_step_through`` (never inherited: a subclass that does not set it takes
the layered step); the Module's step hooks are looked up in the hook table.

**A strategy whose ``training_step`` already ran backward** (pipeline parallel: the schedule does
forward and backward per microbatch) sets ``training_step_runs_backward`` to True: the step then
zeroes gradients *before* ``training_step`` and does not backpropagate the returned loss again;
the hooks around backward still run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from phalanx.errors import MisconfigurationError
from phalanx.hooks import STEP_HOOKS
from phalanx.module import Module
from phalanx.utilities.model_helpers import is_overridden
from phalanx.utilities.wrappers import call_through_wrapper

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["StepOptimizer", "TrainingStep", "direct_step", "run_automatic", "run_direct", "takes_batch_idx"]


class StepOptimizer:
    """What ``Module.optimizers()`` and ``Module.optimizer_step`` see: an optimizer that steps
    through the strategy, so precision scaling and strategy logic apply to manual calls too.

    Lightning's ``LightningOptimizer`` (``phalanx.core.optimizer.LightningOptimizer`` is this class).
    As in Lightning, each wrapper's class is made a subclass of the wrapped optimizer's
    (``LightningSGD``), so ``isinstance(opt, torch.optim.SGD)`` holds and code written against the
    optimizer's type keeps working. Unlike a plain subclass, every attribute other than the wrapper's
    own is the wrapped ``optimizer``'s, read *and* written (``param_groups``, ``state``,
    ``load_state_dict``): the wrapper holds no optimizer state of its own, so it can never drift from
    the optimizer the strategy steps and checkpoints.
    """

    optimizer: Optimizer
    _run: Run | None

    def __init__(self, optimizer: Optimizer, run: Run | None = None) -> None:
        object.__setattr__(self, "optimizer", optimizer)
        object.__setattr__(self, "_run", run)
        cls = _wrapper_base(type(self))
        if isinstance(optimizer, Optimizer):
            try:
                object.__setattr__(self, "__class__", _imitating_class(cls, type(optimizer)))
            except TypeError:  # an optimizer class whose layout cannot be combined (__slots__): stay plain
                pass

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        """Step through ``strategy.optimizer_step``; counts an optimizer step in manual optimization.

        Raises:
            MisconfigurationError: The optimizer is not attached to a running Trainer (built by hand).
        """
        run = self._run
        if run is None:
            msg = (
                f"{self!r}.step() was called outside a Trainer run: the wrapper steps through the strategy of a "
                "running fit. Fix: call step() on the optimizers from `self.optimizers()` inside a step, or "
                "step the plain optimizer (`.optimizer.step()`) outside the Trainer."
            )
            raise MisconfigurationError(msg)
        if closure is None:
            closure = _noop
        result = run.strategy.optimizer_step(self.optimizer, closure, run.module, **kwargs)
        if not run.module.automatic_optimization:
            run.count_manual_step()
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset gradients."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattribute__(self, name: str) -> Any:
        # The imitated optimizer class sits in the MRO (for isinstance), but its methods and attributes
        # must act on the wrapped optimizer, not on this empty shell: only the wrapper's own names
        # (and dunders, which Python looks up on the type anyway) are looked up here.
        # the per-class cache read inline: this runs on every attribute access of the step's hot path
        names = object.__getattribute__(self, "__class__").__dict__.get("_wrapper_names_cache")
        if name.startswith("__") or name in (names or _wrapper_names(type(self))):
            return object.__getattribute__(self, name)
        # read through __dict__: while unpickling, ``optimizer`` is not set yet, and asking for it
        # here would recurse forever (torch.save(trainer) then torch.load must round-trip)
        optimizer = object.__getattribute__(self, "__dict__").get("optimizer")
        if optimizer is None:
            return object.__getattribute__(self, name)
        return getattr(optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _wrapper_names(type(self)) or "optimizer" not in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            setattr(self.optimizer, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # the imitating class is made at run time and cannot be pickled by name: rebuild it on load
        return (_wrapper_base(type(self)), (self.optimizer, self._run))

    def __repr__(self) -> str:
        return f"Lightning{self.optimizer!r}"


def _wrapper_base(cls: type) -> type:
    """The wrapper class an imitating class was made from (``cls`` itself for one not made so)."""
    return cls.__dict__.get("_wrapper_base", cls)  # type: ignore[no-any-return]


def _wrapper_names(cls: type) -> frozenset[str]:
    """The names the wrapper classes (not the imitated optimizer class) define, cached per class."""
    cached = cls.__dict__.get("_wrapper_names_cache")
    if cached is None:
        base = _wrapper_base(cls)
        names = {"optimizer", "_run"}
        for klass in base.__mro__:
            if klass is not object:
                names.update(klass.__dict__)
        cached = frozenset(names)
        type.__setattr__(cls, "_wrapper_names_cache", cached)
    return cached  # type: ignore[no-any-return]


_IMITATING: dict[tuple[type, type], type] = {}


def _imitating_class(wrapper: type, optimizer_class: type) -> type:
    """``Lightning<Optimizer>``: a subclass of both, made once per pair."""
    key = (wrapper, optimizer_class)
    made = _IMITATING.get(key)
    if made is None:
        namespace = {"_wrapper_base": wrapper, "__module__": wrapper.__module__}
        made = type(f"Lightning{optimizer_class.__name__}", (wrapper, optimizer_class), namespace)
        _IMITATING[key] = made
    return made


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

    __slots__ = ("_run", "batch", "batch_idx", "divisor", "optimizer", "outputs", "ran", "zero_grad")

    def __init__(
        self, run: Run, batch: Any, batch_idx: int, optimizer: Optimizer, *, zero_grad: bool, divisor: int
    ) -> None:
        self._run = run
        self.batch = batch
        self.batch_idx = batch_idx
        self.optimizer = optimizer
        self.zero_grad = zero_grad
        self.divisor = divisor
        self.outputs: Any = None
        self.ran = False

    def __call__(self) -> torch.Tensor | None:
        run = self._run
        strategy, hooks = run.strategy, run.hooks
        live = hooks.live
        ran_backward = run.training_step_runs_backward
        if ran_backward and self.zero_grad:  # the step's own backward writes the gradients: clear them first
            if "on_before_zero_grad" in live:
                hooks.call("on_before_zero_grad", self.optimizer)
            run.module.optimizer_zero_grad(run.fit_loop.epoch, self.batch_idx, self.optimizer)
        hooks.current = "training_step"
        args = (self.batch, self.batch_idx) if run.step_takes_batch_idx else (self.batch,)
        if run.profiler is None:
            output = strategy.training_step(*args)
        else:
            with run.profiler.profile(f"[Strategy]{type(strategy).__name__}.training_step"):
                output = strategy.training_step(*args)
        strategy.post_training_step()  # Lightning's hook for strategies (nothing by default)
        detached = None
        if type(output) is torch.Tensor:  # the common case, without the general checks' calls
            loss: torch.Tensor | None = output
            detached = output.detach()
            self.outputs = {"loss": detached}
        else:
            loss = _loss_of(output)
            self.outputs = _detached_outputs(output, loss)
        self.ran = True
        if self.zero_grad and not ran_backward:
            if "on_before_zero_grad" in live:
                hooks.call("on_before_zero_grad", self.optimizer)
            run.module.optimizer_zero_grad(run.fit_loop.epoch, self.batch_idx, self.optimizer)
        if loss is None:
            return None
        if self.divisor > 1:
            loss = loss / self.divisor
        if "on_before_backward" in live:
            hooks.call("on_before_backward", loss)
        if not ran_backward:
            strategy.backward(loss, self.optimizer)
        if "on_after_backward" in live:
            hooks.call("on_after_backward")
        return detached if self.divisor == 1 and detached is not None else loss.detach()


def run_automatic(run: Run, batch: Any, batch_idx: int, *, step_now: bool) -> Any:
    """Run one batch with automatic optimization; returns the step outputs.

    Args:
        run: The stage's Run.
        batch: The batch, already on the device.
        batch_idx: Index of the batch in the epoch.
        step_now: Whether this batch closes an accumulation window (the optimizer steps).
    """
    strategy = run.strategy
    accumulate = run.fit_loop.accumulate_grad_batches
    handles = strategy.handles_gradient_accumulation
    closure = TrainingStep(
        run,
        batch,
        batch_idx,
        run.optimizers[0],
        zero_grad=batch_idx % accumulate == 0,
        divisor=1 if handles else accumulate,
    )
    if step_now or handles:
        run.hooks.current = "optimizer_step"
        run.module.optimizer_step(run.fit_loop.epoch, batch_idx, run.step_optimizers[0], closure)
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


#: The Module's methods that, overridden, customise the step.
_MODULE_STEP_METHODS = ("optimizer_step", "optimizer_zero_grad", "backward")
#: Step methods that, assigned on a strategy or precision *instance*, customise it as a subclass would.
_STRATEGY_STEP_METHODS = (
    "optimizer_step",
    "backward",
    "pre_backward",
    "post_backward",
    "training_step",
    "post_training_step",
)
_PRECISION_STEP_METHODS = ("optimizer_step", "backward", "pre_backward", "post_backward", "train_step_context")
_NOT_RUN: Any = object()  # run_direct's outputs until the closure has run


def takes_batch_idx(method: Callable[..., Any]) -> bool:
    """Whether a step method accepts ``batch_idx`` (Lightning calls ``training_step(self, batch)`` without it).

    It does when it names a ``batch_idx`` parameter, takes ``*args``, or takes two positional
    parameters or more.
    """
    try:
        spec = inspect.getfullargspec(method)
    except TypeError:  # a builtin or C callable: pass everything
        return True
    names = spec.args[1:] if inspect.ismethod(method) or spec.args[:1] == ["self"] else spec.args
    return "batch_idx" in names or spec.varargs is not None or len(names) >= 2


def direct_step(run: Run) -> Callable[..., Any] | None:
    """What :func:`run_direct` calls for ``training_step`` in this fit, or None for the layered step.

    Not None when every layer of the step would only pass it through: automatic optimization
    without gradient clipping, no step hook with anything to call, a strategy and a
    precision that declare ``passes_step_through`` (so 32-true), no profiler, and the Module's
    ``optimizer_step`` / ``optimizer_zero_grad`` not overridden. Then the step is the Module's
    ``training_step``, called through the strategy's ``forward_wrapper`` when it has one (DDP's
    wrapper, an FSDP2 module) exactly as the layered step calls it. Decided once, when training
    starts; anything customised keeps the layered path. Accumulation is judged per epoch by the
    fit loop (a schedule may change it): the direct step serves only epochs that do not accumulate.
    """
    strategy, module, config = run.strategy, run.module, run.config
    precision = strategy.precision_plugin
    direct = (
        module.automatic_optimization
        and not config.gradient_clip_val
        and not run.hooks.custom_clipping
        and run.hooks.live.isdisjoint(STEP_HOOKS)
        and strategy.passes_step_through
        and not run.training_step_runs_backward
        and run.profiler is None
        and precision.passes_step_through
        and not any(is_overridden(name, module, Module) for name in _MODULE_STEP_METHODS)
        and not any(is_overridden(name, strategy, type(strategy)) for name in _STRATEGY_STEP_METHODS)
        and not any(is_overridden(name, precision, type(precision)) for name in _PRECISION_STEP_METHODS)
    )
    if not direct:
        return None
    wrapper = strategy.forward_wrapper
    if wrapper is None:
        return module.training_step  # type: ignore[union-attr]
    return partial(call_through_wrapper, wrapper, module, "training_step")


def run_direct(run: Run, step: Callable[..., Any], batch: Any, batch_idx: int) -> Any:
    """:func:`run_automatic` with the pass-through layers left out (see :func:`direct_step`).

    The same calls in the same order, as Lightning makes them: ``optimizer.step(closure)``, and in
    the closure ``training_step``, ``optimizer.zero_grad()``, ``loss.backward()``. The per-step
    call-count test in core/tests holds the fit loop to this path's cost.
    """
    optimizer = run.optimizers[0]
    outputs: Any = _NOT_RUN

    def closure() -> torch.Tensor | None:
        nonlocal outputs
        output = step(batch, batch_idx) if run.step_takes_batch_idx else step(batch)
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

    run.hooks.current = "training_step"
    optimizer.step(closure=closure)  # type: ignore[arg-type]  # torch's stub says float; a tensor is what it returns
    if outputs is _NOT_RUN:
        msg = (
            f"{type(optimizer).__name__}.step() returned without calling its closure, so training_step and "
            "backward never ran; an optimizer used with automatic optimization must call closure() in step()."
        )
        raise MisconfigurationError(msg)
    return outputs
