"""How a stage calls hooks: callbacks first (only those overriding the hook), then the Module.

Hooks run several times per batch, so the bound methods are looked up once per stage; callback
hooks and per-batch Module hooks left at their no-op defaults are skipped entirely (same outcome,
less per-step work). The loops go one step further: they test ``name in hooks.live`` before
calling :meth:`HookRunner.call`, so a batch whose hooks are all no-ops makes no dispatch call at
all (a per-step call-count test holds the loop to that).

:attr:`HookRunner.current` names the hook running now, so ``self.log`` can apply the right
defaults. It lives here, not on the Module, because assigning Module attributes goes through
``nn.Module.__setattr__``, which is slow enough to show up in step time.
"""

from __future__ import annotations

import sys
from typing import Any

from phalanx.callbacks.callback import Callback
from phalanx.hooks import CALLBACK_HOOKS, PER_BATCH_HOOKS
from phalanx.module import Module
from phalanx.utilities.model_helpers import is_overridden

__all__ = ["HookRunner"]


class HookRunner:
    """Calls the hooks of one stage's callbacks and Module.

    Args:
        trainer: What callbacks receive as ``trainer`` (the Trainer, seen as a TrainerView).
        callbacks: The callbacks, in call order.
        module: The Module being run.

    Attributes:
        current: The hook or step running now (``self.log`` reads it); None between hooks.
        calls: How many hooks were entered: progress, for the hang watchdog.
        live: Per-batch hooks with something to call (a callback or a Module override).
        custom_clipping: Whether the Module overrides ``configure_gradient_clipping``.
        epoch_end_first / epoch_end_monitoring: ``on_train_epoch_end`` of the callbacks that run
            before the epoch's metrics are aggregated, and of those that monitor them (they run
            after: ModelCheckpoint, early stopping).
    """

    def __init__(self, trainer: Any, callbacks: list[Callback], module: Module, *, profiler: Any = None) -> None:
        self.trainer = trainer
        self.module = module
        self.current: str | None = None
        self.calls = 0  # hooks entered so far: the hang watchdog's sign of progress
        self._profiler = profiler
        self._callback_hooks: dict[str, list[Any]] = {
            name: [
                self._timed(getattr(cb, name), f"[Callback]{type(cb).__qualname__}.{name}")
                for cb in callbacks
                if _runs(name, cb)
            ]
            for name in CALLBACK_HOOKS
        }
        # Module hooks left at phalanx's no-op default are skipped (the same outcome, less per-step work)
        self._module_hooks: dict[str, Any] = {
            name: self._timed(getattr(module, name), f"[Module]{type(module).__qualname__}.{name}")
            for name in PER_BATCH_HOOKS
            if is_overridden(name, module, Module)
        }
        self.live: frozenset[str] = frozenset(
            name for name in PER_BATCH_HOOKS if self._callback_hooks.get(name) or name in self._module_hooks
        )
        self.custom_clipping = is_overridden("configure_gradient_clipping", module, Module)
        ends = [cb for cb in callbacks if _runs("on_train_epoch_end", cb)]
        self.epoch_end_first = [cb.on_train_epoch_end for cb in ends if not cb.monitors_metrics]
        self.epoch_end_monitoring = [cb.on_train_epoch_end for cb in ends if cb.monitors_metrics]

    def _timed(self, method: Any, action: str) -> Any:
        """``method``, recorded under ``action`` by the Trainer's profiler (itself without one)."""
        profiler = self._profiler
        if profiler is None:
            return method

        def timed(*args: Any) -> Any:
            with profiler.profile(action):
                return method(*args)

        return timed

    def call(self, name: str, *args: Any) -> Any:
        """Call ``name`` on the callbacks (those overriding it), then on the Module; returns the Module's result."""
        previous = self.current
        self.current = name
        self.calls += 1
        trainer, module = self.trainer, self.module
        for hook in self._callback_hooks.get(name, ()):
            hook(trainer, module, *args)
        method = self._module_hooks.get(name)
        if method is None and name not in PER_BATCH_HOOKS:
            method = self._timed(getattr(module, name), f"[Module]{type(module).__qualname__}.{name}")
        result = method(*args) if method is not None else None
        self.current = previous
        return result

    def call_callbacks(self, name: str, *args: Any) -> None:
        """Call ``name`` on the callbacks only (``setup``, ``on_exception``: the Module's differ)."""
        for hook in self._callback_hooks.get(name, ()):
            hook(self.trainer, self.module, *args)

    def call_module(self, name: str, *args: Any) -> Any:
        """Call the Module's ``name`` only, with :attr:`current` set; returns its result."""
        previous = self.current
        self.current = name
        self.calls += 1
        try:
            return self._timed(getattr(self.module, name), f"[Module]{type(self.module).__qualname__}.{name}")(*args)
        finally:
            self.current = previous


def _runs(name: str, callback: Any) -> bool:
    """Whether ``callback``'s ``name`` hook must be called: it overrides Callback's no-op.

    A mock standing in for the hook (``Mock(spec=Callback)``, used to record the calls a Trainer
    makes) counts as an override, since skipping it would hide exactly the calls it records.
    """
    mock = sys.modules.get("unittest.mock")  # a mock exists only if unittest.mock was imported
    if mock is not None and isinstance(getattr(callback, name, None), mock.NonCallableMock):
        return True
    return is_overridden(name, callback, Callback)
