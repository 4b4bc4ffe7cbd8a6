"""Skip ``torch.nn.init`` while building a model whose weights will be overwritten.

Random initialisation of a large model costs real time and is wasted when a checkpoint is loaded
right after; ``Strategy.tensor_init_context(empty_init=True)`` uses this mode to allocate the
parameters but leave their memory uninitialised.
"""

from __future__ import annotations

from typing import Any

from torch.overrides import TorchFunctionMode

__all__ = ["SkipInit"]


class SkipInit(TorchFunctionMode):
    """A torch-function mode in which every ``torch.nn.init.*`` call returns its tensor untouched."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)
