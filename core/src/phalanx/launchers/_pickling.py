"""Find what cannot be pickled, so ``ddp_spawn`` can name it instead of showing pickle's riddle.

``spawn`` sends the Trainer, the Module and everything they reference to each worker by pickling.
Pickle's own error names a type ("cannot pickle '_thread.lock' object") but not where it sits; a
user needs the attribute path (``trainer.callbacks[2].lock``) to fix it.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

__all__ = ["find_unpicklable"]

_MAX_DEPTH = 12


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - any failure means "not picklable"; the caller reports it
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

    Descends into the first unpicklable attribute / item at each level until none of the children
    fails on its own: that object is the culprit (a lambda, a lock, an open file ...).
    """
    if _picklable(obj):
        return None
    current, current_path = obj, path
    seen: set[int] = {id(obj)}
    for _ in range(_MAX_DEPTH):
        for child, child_path in _children(current, current_path):
            if id(child) in seen:
                continue
            seen.add(id(child))
            if not _picklable(child):
                current, current_path = child, child_path
                break
        else:
            break
    return current_path, current
