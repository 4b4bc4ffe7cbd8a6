"""Import rich for the Rich* callbacks, or fail with the one message that says how to get it."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require_rich"]


def require_rich(user: str) -> ModuleType:
    """The ``rich`` module; ModuleNotFoundError naming ``pip install rich`` when it is missing.

    Args:
        user: The class that needs rich, named in the message.
    """
    try:
        return importlib.import_module("rich")
    except ImportError:
        msg = f"`{user}` requires the optional package `rich`, which is not installed. Fix: `pip install rich`."
        raise ModuleNotFoundError(msg) from None
