"""How the Trainer calls hooks: callbacks first (only those overriding the hook), then the Module.

Hooks run several times per batch, so the bound methods are looked up once per run; callback hooks
and per-batch Module hooks left at their no-op defaults are skipped entirely (same outcome, less
per-step work). The ``_current_fx`` attribute names the running hook so ``self.log`` can apply the
right defaults; it lives on the Trainer because assigning Module attributes goes through
``nn.Module.__setattr__``, which is slow enough to show up in step time.

The per-batch loops go one step further: they test ``name in trainer._live_hooks`` before calling
:meth:`HookDispatch._call_hooks`, so a batch whose hooks are all no-ops makes no dispatch call at
all (a per-step call-count test holds the loop to that).
"""

from __future__ import annotations

from typing import Any

import torch

from phalanx.callbacks.callback import Callback
from phalanx.trainer.run import is_overridden

__all__ = ["HookDispatch"]

_CALLBACK_HOOKS = [name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown")]
#: Per-batch Module hooks whose no-op defaults the Trainer may skip.
_MODULE_HOOKS = frozenset(
    [
        "on_train_batch_start",
        "on_train_batch_end",
        "on_before_zero_grad",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_validation_batch_start",
        "on_validation_batch_end",
        "on_test_batch_start",
        "on_test_batch_end",
        "on_predict_batch_start",
        "on_predict_batch_end",
    ]
)


class HookDispatch:
    """Mixin of :class:`~phalanx.trainer.trainer.Trainer` that dispatches hooks."""

    callbacks: list[Callback]
    gradient_clip_val: float | None
    gradient_clip_algorithm: str
    _module: Any
    _current_fx: str | None
    _hooks: dict[str, list[Any]]
    _module_hooks: dict[str, Any]
    _epoch_end_hooks: dict[bool, list[Any]]
    _custom_clipping: bool
    #: Per-batch hooks with something to call (a callback or Module override); others are skipped.
    _live_hooks: frozenset[str] = frozenset()

    def _build_hook_cache(self) -> None:
        """Bind the callback hooks each callback overrides, so no-op hooks cost nothing per batch."""
        hooks: dict[str, list[Any]] = {}
        for name in _CALLBACK_HOOKS:
            base = getattr(Callback, name)
            hooks[name] = [getattr(cb, name) for cb in self.callbacks if getattr(type(cb), name, base) is not base]
        self._hooks = hooks
        module = self._module
        # Module hooks left at phalanx's no-op default are skipped (the same outcome, less per-step work)
        self._module_hooks = {
            name: getattr(module, name)
            for name in _MODULE_HOOKS
            if module is not None and (name in vars(module) or is_overridden(module, name))
        }
        self._live_hooks = frozenset(
            name for name in _MODULE_HOOKS if hooks.get(name) or name in self._module_hooks
        )
        self._custom_clipping = self._module is not None and is_overridden(self._module, "configure_gradient_clipping")
        self._epoch_end_hooks = {
            monitoring: [
                cb.on_train_epoch_end
                for cb in self.callbacks
                if bool(getattr(cb, "_monitoring", False)) == monitoring
                and type(cb).on_train_epoch_end is not Callback.on_train_epoch_end
            ]
            for monitoring in (False, True)
        }

    def _call_hooks(self, name: str, *args: Any) -> Any:
        """Call ``name`` on the callbacks (those overriding it), then on the Module; returns the Module's result."""
        module = self._module
        previous = self._current_fx
        self._current_fx = name
        for hook in self._hooks.get(name, ()):
            hook(self, module, *args)
        method = self._module_hooks.get(name)
        if method is None and name not in _MODULE_HOOKS:
            method = getattr(module, name)
        result = method(*args) if method is not None else None
        self._current_fx = previous
        return result

    def _call_module_hook(self, name: str, *args: Any) -> Any:
        module = self._module
        self._current_fx = name
        result = getattr(module, name)(*args)
        self._current_fx = None
        return result

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Called by the precision between backward and the update: hooks, then gradient clipping."""
        if "on_before_optimizer_step" in self._live_hooks:
            self._call_hooks("on_before_optimizer_step", optimizer)
        if self.gradient_clip_val or self._custom_clipping:
            self._current_fx = "configure_gradient_clipping"
            self._module.configure_gradient_clipping(
                optimizer,
                gradient_clip_val=self.gradient_clip_val,
                gradient_clip_algorithm=self.gradient_clip_algorithm,
            )
        self._current_fx = "training_step"
