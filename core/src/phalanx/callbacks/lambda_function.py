"""LambdaCallback: a callback made of plain functions, for one-off behaviour without a class.

A quick experiment ("print the step count every epoch") should not need a Callback subclass. Each
keyword names a hook and gives the function to run there; the function becomes that hook of this
instance, so the Trainer sees it as overridden and calls it, while hooks left out stay the free
defaults. An unknown keyword is an error rather than silently ignored, since a misspelt hook
would otherwise never run.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.hooks import CALLBACK_HOOKS

__all__ = ["LambdaCallback"]


class LambdaCallback(Callback):
    """Run the given functions at the hooks they are named after.

    Each function receives the hook's arguments, e.g. ``on_train_epoch_end=lambda trainer,
    pl_module: ...`` (see :class:`~phalanx.callbacks.Callback` for every hook's signature).
    A keyword set to None is skipped, as when it is left out.

    Args:
        **hooks: Hook name -> callable, for any hook of :data:`phalanx.hooks.CALLBACK_HOOKS`.

    Raises:
        MisconfigurationError: A keyword is not a callback hook, or its value is not callable.
    """

    def __init__(self, **hooks: Callable[..., Any] | None) -> None:
        unknown = sorted(name for name in hooks if name not in CALLBACK_HOOKS)
        if unknown:
            close = [match for name in unknown for match in difflib.get_close_matches(name, CALLBACK_HOOKS, n=1)]
            hint = f" Did you mean {close}?" if close else ""
            msg = (
                f"LambdaCallback got unknown hook name(s) {unknown}; valid hooks are {sorted(CALLBACK_HOOKS)}."
                f"{hint} Fix: pass the functions under those names."
            )
            raise MisconfigurationError(msg)
        for name, function in hooks.items():
            if function is None:
                continue
            if not callable(function):
                msg = (
                    f"LambdaCallback({name}={function!r}) needs a callable (a function or lambda taking the "
                    f"hook's arguments); got {type(function).__name__}. Fix: pass e.g. {name}=lambda *args: ..."
                )
                raise MisconfigurationError(msg)
            setattr(self, name, function)
