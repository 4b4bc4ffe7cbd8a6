"""Call a Module's step method through the wrapper that owns it.

Wrappers such as ``DistributedDataParallel`` or FSDP do their work (gradient-sync bookkeeping,
parameter unsharding, forward hooks) inside their own ``forward``, which ends in
``module(*args)``. Calling ``module.training_step`` directly would bypass all of it, so the step
is temporarily installed as the module's ``forward`` and the *wrapper* is called instead.
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

    The redirect is an instance attribute removed (or restored, when nested) in ``finally``, so
    the module's class-level ``forward`` is untouched afterwards even if the step raises.
    """
    step = getattr(module, method_name)
    previous = module.__dict__.get("forward", _MISSING)
    module.forward = step  # type: ignore[method-assign]
    try:
        return wrapper(*args, **kwargs)
    finally:
        if previous is _MISSING:
            del module.forward
        else:
            module.forward = previous  # type: ignore[method-assign]
