"""Does a hook accept an argument? (Lightning's ``is_param_in_hook_signature``.)

Steps and hooks may be written with or without optional arguments (``training_step(self, batch)``
or ``(self, batch, batch_idx)``); callers ask before passing one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["is_param_in_hook_signature"]


def is_param_in_hook_signature(
    hook_fx: Callable[..., Any], param: str, explicit: bool = False, min_args: int | None = None
) -> bool:
    """Whether the hook ``hook_fx`` (a method: its first parameter is ``self``) takes ``param``.

    Args:
        hook_fx: The hook; a decorator's ``__wrapped__`` function is inspected instead.
        param: The argument's name.
        explicit: Only a positional parameter of that name counts; otherwise ``*args`` counts too.
        min_args: Also count the hook as taking it when it declares at least this many positional
            parameters besides ``self``.
    """
    hook_fx = getattr(hook_fx, "__wrapped__", hook_fx)
    spec = inspect.getfullargspec(hook_fx)
    positional = spec.args[1:]
    return (
        param in positional
        or (not explicit and spec.varargs is not None)
        or (isinstance(min_args, int) and len(positional) >= min_args)
    )
