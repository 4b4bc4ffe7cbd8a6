"""Ask whether a user's class replaces one of phalanx's default methods.

The Trainer, callbacks and strategies skip work for hooks nobody implemented (no validation loop
without ``validation_step``, no per-step call for a hook that is still the empty default). That
needs one precise answer to "did the user override this?", including the cases a plain
``type(obj).name is not Base.name`` misses: a method assigned on the instance, and methods
wrapped by ``functools.wraps``-style decorators, ``functools.partial`` or ``unittest.mock``.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

__all__ = ["get_torchvision_model", "is_overridden"]


def _underlying(attribute: Any) -> Any:
    """The function behind ``attribute``: unbind methods, unwrap partials, mocks and decorators.

    Loops because the layers nest (a mock wrapping a bound method of a decorated function).
    """
    mock = sys.modules.get("unittest.mock")  # a mock exists only if unittest.mock was imported
    seen: list[Any] = []  # the objects themselves, not ids: a freed object's id can be reused
    while not any(attribute is earlier for earlier in seen):  # a ``__wrapped__`` cycle ends the walk
        seen.append(attribute)
        if inspect.ismethod(attribute):
            attribute = attribute.__func__
        elif isinstance(attribute, functools.partial):
            attribute = attribute.func
        elif mock is not None and isinstance(attribute, mock.NonCallableMock):
            attribute = attribute._mock_wraps
        elif attribute is not None and hasattr(attribute, "__wrapped__"):
            attribute = attribute.__wrapped__
        else:
            break
    return attribute


def is_overridden(method_name: str, instance: object, parent: type) -> bool:
    """Whether ``instance`` replaces ``parent``'s ``method_name``, in its class or on itself.

    Lightning's ``is_overridden(method_name, instance, parent)``, with one difference: ``parent``
    is required. Lightning infers it from the instance (LightningModule, DataModule, Callback), but
    this module sits below ``phalanx.module`` and ``phalanx.callbacks`` and must not import them;
    callers pass ``phalanx.Module`` or ``phalanx.callbacks.Callback`` (or any base) themselves.

    Two attributes count as the same method when, after unbinding and unwrapping decorators,
    partials and ``Mock(wraps=...)``, they share their code object; so a subclass that merely
    inherits the method, or re-binds the parent's function, is not an override.

    Args:
        method_name: The method to look up, e.g. ``"validation_step"``.
        instance: The object to inspect; ``None`` (e.g. no Module attached yet) is never
            overriding, as in Lightning.
        parent: The base class whose default implementation is compared against.

    Returns:
        True when ``instance``'s class, or an attribute set on the instance itself, provides
        ``method_name`` and it is not ``parent``'s implementation. False when it is the parent's,
        or when the instance has no such attribute (or it is ``None``, or a mock wrapping nothing).

    Raises:
        ValueError: ``parent`` does not define ``method_name``, so there is nothing to override.
            Checked first, unlike Lightning, so a misspelt hook name fails loudly instead of
            reading as "not overridden".
    """
    default = getattr(parent, method_name, None)
    if default is None:
        msg = (
            f"is_overridden({method_name!r}, ..., parent={parent.__qualname__}) cannot answer: "
            f"{parent.__qualname__} has no method {method_name!r}. Pass the base class that defines "
            "the default implementation (e.g. phalanx.Module or phalanx.callbacks.Callback)."
        )
        raise ValueError(msg)
    if instance is None:
        return False
    own = _underlying(getattr(instance, method_name, None))
    if own is None:
        return False
    default = _underlying(default)
    own_code = getattr(own, "__code__", None)
    default_code = getattr(default, "__code__", None)
    if own_code is not None and default_code is not None:
        return own_code is not default_code
    return own is not default


def get_torchvision_model(model_name: str, **kwargs: Any) -> Any:
    """Build torchvision's model ``model_name`` (e.g. ``"resnet18"``) with ``kwargs`` (``weights=...``).

    Raises:
        ModuleNotFoundError: torchvision is not installed; the message says how to install it.
    """
    try:
        from torchvision import models
    except ImportError as error:
        msg = f"get_torchvision_model({model_name!r}) needs torchvision, which is not installed. Fix: pip install torchvision"
        raise ModuleNotFoundError(msg) from error
    if hasattr(models, "get_model"):  # torchvision 0.14 and later: every model by name
        return models.get_model(model_name, **kwargs)
    return getattr(models, model_name)(**kwargs)
