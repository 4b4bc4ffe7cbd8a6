"""Call a Module's step method through ``module.__call__``, so FSDP2's hooks run around it.

FSDP2 does not wrap the model: it registers forward pre/post hooks on the module itself (the root
one unshards the root's own parameters, casts inputs for mixed precision and prepares backward).
Those hooks only run through ``__call__``; calling ``module.training_step`` directly would skip
them. So the step is installed as ``forward`` for one call, and the real ``forward`` is put back
as soon as the hooks have run, because the step usually calls ``self(x)`` itself.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["call_through_hooks"]

_MISSING = object()


def call_through_hooks(module: nn.Module, method_name: str, *args: Any, **kwargs: Any) -> Any:
    """Run ``module.<method_name>(*args, **kwargs)`` via ``module(*args, **kwargs)``."""
    step = getattr(module, method_name)
    previous = module.__dict__.get("forward", _MISSING)

    def restore() -> None:
        if previous is _MISSING:
            module.__dict__.pop("forward", None)
        else:
            module.forward = previous  # type: ignore[method-assign]

    def redirected(*inner_args: Any, **inner_kwargs: Any) -> Any:
        restore()
        return step(*inner_args, **inner_kwargs)

    module.forward = redirected  # type: ignore[method-assign]
    try:
        return module(*args, **kwargs)
    finally:
        restore()
