"""Find what cannot be pickled, so ``ddp_spawn`` can name it instead of showing pickle's riddle.

``spawn`` sends the Trainer, the Module and everything they reference to each worker by pickling.
Pickle's own error names a type ("cannot pickle '_thread.lock' object") but not where it sits; a
user needs the attribute path (``trainer.callbacks[2].lock``) to fix it.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from typing import Any

__all__ = ["find_unpicklable"]

_MAX_DEPTH = 12


class _StubbingPickler(pickle.Pickler):
    """Pickles ``obj`` but replaces the objects in ``stubbed`` by tokens.

    An attribute that refers back to an ancestor (``trainer.fit_loop.trainer``) would otherwise
    fail only because the ancestor does; stubbing ancestors isolates what fails on its own.
    """

    def __init__(self, file: io.BytesIO, root: Any, stubbed: set[int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._root = root
        self._stubbed = stubbed

    def persistent_id(self, obj: Any) -> Any:
        if obj is not self._root and id(obj) in self._stubbed:
            return id(obj)
        return None


def _picklable(obj: Any, stubbed: set[int] | None = None) -> bool:
    try:
        _StubbingPickler(io.BytesIO(), obj, stubbed or set()).dump(obj)
    except Exception:
        return False
    return True


def _children(obj: Any, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield value, f"{path}[{key!r}]"
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for index, value in enumerate(obj):
            yield value, f"{path}[{index}]"
    else:
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            for key, value in state.items():
                if key in ("_modules", "_parameters", "_buffers") and isinstance(value, dict):
                    for sub, item in value.items():
                        yield item, f"{path}.{sub}"
                else:
                    yield value, f"{path}.{key}"
        bound_self = getattr(obj, "__self__", None)
        if bound_self is not None:
            yield bound_self, f"{path}.__self__"


def find_unpicklable(obj: Any, path: str = "obj") -> tuple[str, Any] | None:
    """Return ``(attribute path, object)`` of the innermost unpicklable part of ``obj``, or None.

    Descends into the first attribute / item that fails to pickle on its own (references back to
    its ancestors stubbed out) until none of its children does: that object is the culprit (a
    lambda, a lock, an open file ...).
    """
    if _picklable(obj):
        return None
    ancestors: set[int] = {id(obj)}
    visited: set[int] = {id(obj)}
    current, current_path = obj, path
    for _ in range(_MAX_DEPTH):
        for child, child_path in _children(current, current_path):
            if id(child) in visited:
                continue
            visited.add(id(child))
            if not _picklable(child, ancestors):
                current, current_path = child, child_path
                ancestors.add(id(child))
                break
        else:
            break
    return current_path, current
