"""Map a function over the leaves of a nested batch.

Batches arrive in whatever shape the user's dataset produces: tensors inside dicts, lists,
tuples, namedtuples or dataclasses. Moving a batch to a device, casting it to a precision or
cloning a checkpoint for a background save all need the same walk, so it lives here once and keeps
every container's type (a namedtuple stays that namedtuple, an ``OrderedDict`` stays ordered).
Strategy plugins walk batches and checkpoints the same way, so this module is public (Lightning's
``utilities.apply_func``) rather than private to the core.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["apply_to_collection", "move_data_to_device"]


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def _is_dataclass_instance(obj: object) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def apply_to_collection(
    data: Any,
    dtype: type | tuple[type, ...],
    function: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Return ``data`` with ``function`` applied to every leaf that is an instance of ``dtype``.

    A leaf matching ``dtype`` is transformed even when it is itself a container, so callers can
    target e.g. a custom batch class that knows how to move itself. Containers are rebuilt rather
    than mutated: the caller's batch or checkpoint is never changed behind its back.

    Args:
        data: The (possibly nested) collection to walk.
        dtype: Leaf type(s) that ``function`` is applied to.
        function: Called as ``function(leaf, *args, **kwargs)``.
        *args: Extra positional arguments for ``function``.
        **kwargs: Extra keyword arguments for ``function``.

    Returns:
        A collection of the same structure and container types holding the transformed leaves.
    """
    if isinstance(data, dtype):
        return function(data, *args, **kwargs)
    if isinstance(data, (str, bytes)):
        return data

    def recurse(value: Any) -> Any:
        return apply_to_collection(value, dtype, function, *args, **kwargs)

    if isinstance(data, Mapping):
        items = [(key, recurse(value)) for key, value in data.items()]
        if isinstance(data, defaultdict):
            return type(data)(data.default_factory, items)
        mapping_type: Any = type(data)
        try:
            return mapping_type(items)
        except TypeError:
            # Mapping types whose constructor does not take pairs: fall back to a plain dict.
            return dict(items)
    if _is_namedtuple(data):
        return type(data)(*(recurse(value) for value in data))
    if isinstance(data, (list, tuple, set, frozenset)):
        values = [recurse(value) for value in data]
        try:
            return type(data)(values)
        except TypeError:
            return list(values) if isinstance(data, Sequence) else set(values)
    if _is_dataclass_instance(data):
        # ``dataclasses.replace`` would fail on fields declared ``init=False``; a shallow copy
        # with every field reassigned works for those and for frozen dataclasses alike.
        result = copy.copy(data)
        for field in dataclasses.fields(data):
            object.__setattr__(result, field.name, recurse(getattr(data, field.name)))
        return result
    return data


class _Transferable(ABC):  # noqa: B024 - an ABC only for its __subclasshook__
    """Anything with a ``to`` method counts as movable (tensors, modules, user batch classes)."""

    @classmethod
    def __subclasshook__(cls, subclass: Any) -> bool:
        if cls is _Transferable:
            return callable(getattr(subclass, "to", None))
        return NotImplemented


def move_data_to_device(batch: Any, device: torch.device | str | int) -> Any:
    """Move every tensor (and every object with a ``to`` method) in ``batch`` to ``device``.

    Host-to-CUDA copies are issued with ``non_blocking=True`` so they overlap with compute; the
    CUDA stream ordering still guarantees the data is there before a kernel reads it.

    Args:
        batch: A tensor or a nested collection containing tensors.
        device: Target device.

    Returns:
        The batch, with the same structure, on ``device``.
    """
    target = torch.device(device) if not isinstance(device, torch.device) else device
    non_blocking = target.type == "cuda"

    def move(data: Any) -> Any:
        if isinstance(data, torch.Tensor):
            return data.to(target, non_blocking=non_blocking)
        moved = data.to(target)
        # Modules move in place and return ``self``; user types may return a new object.
        return data if moved is None else moved

    # The usual batch (a tensor, or a list/tuple of tensors) skips the general walk and its ABC
    # checks: this runs every step, and the result is the same container the walk would build.
    kind = type(batch)
    if kind is torch.Tensor:
        return move(batch)
    if kind is list or kind is tuple:
        moved = []
        for item in batch:
            if type(item) is not torch.Tensor:
                break
            # ``to(target)`` without the keyword parses faster; the keyword only matters for CUDA
            moved.append(item.to(target, non_blocking=True) if non_blocking else item.to(target))
        else:
            return moved if kind is list else tuple(moved)
    return apply_to_collection(batch, _Transferable, move)
