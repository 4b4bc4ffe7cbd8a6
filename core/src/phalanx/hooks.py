"""The hook table: every hook the Trainer calls, who receives it, and how ``self.log`` treats it.

One table instead of five lists. The Callback base class, the Module's hook defaults, the Trainer's
hook runner, ``self.log``'s defaults and the step pipeline all read it, so adding a hook is one
row here plus its default method on ``Callback`` / ``Module`` (a test checks the three agree, and
that every callback hook is dispatched on both step paths).

Torch-free, at the bottom of the core's layers: anything may import it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CALLBACK_HOOKS",
    "HOOKS",
    "LOG_DEFAULTS",
    "MODULE_HOOKS",
    "PER_BATCH_HOOKS",
    "STEP_HOOKS",
    "Hook",
]

_STEP = (True, False)  # self.log defaults (on_step, on_epoch) in training-step hooks
_EPOCH = (False, True)  # ... and everywhere else logging is allowed


@dataclass(frozen=True)
class Hook:
    """One hook.

    Attributes:
        name: The method name (the same on ``Callback`` and ``Module``).
        callback: Callbacks receive it (``hook(trainer, pl_module, *args)``).
        module: The Module receives it (``hook(*args)``).
        per_batch: Called once per batch or step: a no-op default is skipped, not called.
        step: Runs inside the optimizer step (between ``training_step`` and the update); a live one
            makes the Trainer take the layered step.
        log: ``self.log``'s ``(on_step, on_epoch)`` defaults when called from inside it; None when
            logging there is not supported.
    """

    name: str
    callback: bool = True
    module: bool = True
    per_batch: bool = False
    step: bool = False
    log: tuple[bool, bool] | None = None


def _batch(name: str, log: tuple[bool, bool] | None) -> Hook:
    return Hook(name, per_batch=True, log=log)


def _step(name: str) -> Hook:
    return Hook(name, per_batch=True, step=True, log=_STEP)


def _module_only(name: str, log: tuple[bool, bool] | None = None) -> Hook:
    return Hook(name, callback=False, log=log)


#: Every hook, in roughly the order a fit calls them.
HOOKS: tuple[Hook, ...] = (
    Hook("setup"),
    Hook("teardown"),
    Hook("on_exception", module=False),
    Hook("on_save_checkpoint"),
    Hook("on_load_checkpoint"),
    _module_only("prepare_data"),
    _module_only("configure_model"),
    _module_only("configure_sharded_model"),
    _module_only("configure_callbacks"),
    Hook("on_fit_start"),
    Hook("on_sanity_check_start", module=False),
    Hook("on_sanity_check_end", module=False),
    Hook("on_fit_end"),
    Hook("on_train_start", log=_EPOCH),
    Hook("on_train_end"),
    Hook("on_train_epoch_start", log=_EPOCH),
    Hook("on_train_epoch_end", log=_EPOCH),
    _batch("on_train_batch_start", _STEP),
    _batch("on_train_batch_end", _STEP),
    _module_only("training_step", _STEP),
    _step("on_before_zero_grad"),
    _step("on_before_backward"),
    _module_only("backward", _STEP),
    _step("on_after_backward"),
    _step("on_before_optimizer_step"),
    _module_only("optimizer_step", _STEP),
    _module_only("optimizer_zero_grad", _STEP),
    _module_only("configure_gradient_clipping", _STEP),
    _module_only("lr_scheduler_step"),
    Hook("on_validation_start", log=_EPOCH),
    Hook("on_validation_end"),
    Hook("on_validation_epoch_start", log=_EPOCH),
    Hook("on_validation_epoch_end", log=_EPOCH),
    _batch("on_validation_batch_start", _EPOCH),
    _batch("on_validation_batch_end", _EPOCH),
    _module_only("validation_step", _EPOCH),
    _module_only("on_validation_model_zero_grad"),
    _module_only("on_validation_model_eval"),
    _module_only("on_validation_model_train"),
    Hook("on_test_start", log=_EPOCH),
    Hook("on_test_end"),
    Hook("on_test_epoch_start", log=_EPOCH),
    Hook("on_test_epoch_end", log=_EPOCH),
    _batch("on_test_batch_start", _EPOCH),
    _batch("on_test_batch_end", _EPOCH),
    _module_only("test_step", _EPOCH),
    _module_only("on_test_model_eval"),
    _module_only("on_test_model_train"),
    Hook("on_predict_start"),
    Hook("on_predict_end"),
    Hook("on_predict_epoch_start"),
    Hook("on_predict_epoch_end"),
    _batch("on_predict_batch_start", None),
    _batch("on_predict_batch_end", None),
    _module_only("predict_step"),
    _module_only("on_predict_model_eval"),
)

#: Hooks a Callback may override (the methods of ``phalanx.callbacks.Callback``).
CALLBACK_HOOKS: tuple[str, ...] = tuple(hook.name for hook in HOOKS if hook.callback)
#: Hooks the Trainer calls on the Module.
MODULE_HOOKS: tuple[str, ...] = tuple(hook.name for hook in HOOKS if hook.module)
#: Per-batch hooks whose no-op defaults the Trainer skips.
PER_BATCH_HOOKS: frozenset[str] = frozenset(hook.name for hook in HOOKS if hook.per_batch)
#: Hooks inside the optimizer step: one with something to call makes the Trainer take the layered step.
STEP_HOOKS: frozenset[str] = frozenset(hook.name for hook in HOOKS if hook.step)
#: Hooks ``self.log`` may be called from, with their ``(on_step, on_epoch)`` defaults.
LOG_DEFAULTS: dict[str, tuple[bool, bool]] = {hook.name: hook.log for hook in HOOKS if hook.log is not None}

