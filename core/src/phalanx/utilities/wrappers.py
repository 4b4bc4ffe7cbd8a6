"""Call a Module's step method through the wrapper that owns it.

Wrappers such as ``DistributedDataParallel`` or FSDP do their work (gradient-sync bookkeeping,
parameter unsharding, forward hooks) inside their own ``forward``, which ends in
``module(*args)``. Calling ``module.training_step`` directly would bypass all of it, so the step
is temporarily installed as the module's ``forward`` and the *wrapper* is called instead.
Public because every strategy that wraps the model (DDP, FSDP, a vendor's) needs the same redirect,
and the Trainer's direct training step calls through the same redirect as the layered one.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["call_through_wrapper"]

_MISSING = object()


def call_through_wrapper(
    wrapper: nn.Module,
    module: nn.Module,
    method_name: str,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Run ``module.<method_name>(*args, **kwargs)`` by calling ``wrapper(*args, **kwargs)``.

    The redirect undoes itself as soon as the wrapper reaches the module, before the step runs,
    because the step usually calls ``self(x)`` and must get the real ``forward``. A ``finally``
    also undoes it when the wrapper fails before getting there. The redirect is an instance
    attribute, so the module's class-level ``forward`` is never touched.
    """
    step = getattr(module, method_name)
    previous = module.__dict__.get("forward", _MISSING)

    def restore() -> None:
        if previous is _MISSING:
            module.__dict__.pop("forward", None)
        else:
            module.forward = previous  # type: ignore[method-assign]

    def redirected_forward(*inner_args: Any, **inner_kwargs: Any) -> Any:
        restore()
        return step(*inner_args, **inner_kwargs)

    module.forward = redirected_forward  # type: ignore[method-assign]
    try:
        return wrapper(*args, **kwargs)
    finally:
        restore()
