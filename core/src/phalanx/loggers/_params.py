"""Shaping hyperparameters and metric names the way Lightning's loggers do, before a backend sees them.

Backends accept flat ``name -> primitive`` maps only; Lightning flattens nested hyperparameters
with ``/`` and turns everything else into strings, and prefixes metric names with ``<prefix>-``.
Doing the same keeps dashboards, hparams tables and run comparisons identical after a port.
"""

from __future__ import annotations

import inspect
from argparse import Namespace
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

__all__ = ["add_prefix", "convert_params", "flatten_dict", "sanitize_callables", "sanitize_params", "scan_checkpoints"]


def convert_params(params: Mapping[str, Any] | Namespace | None) -> dict[str, Any]:
    """``params`` as a plain dict (an ``argparse.Namespace`` or None are accepted, as in Lightning)."""
    if params is None:
        return {}
    if isinstance(params, Namespace):
        return dict(vars(params))
    return dict(params)


def flatten_dict(params: Mapping[Any, Any], delimiter: str = "/", parent_key: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``; dataclasses and namespaces are opened like dicts."""
    result: dict[str, Any] = {}
    for key, value in params.items():
        new_key = f"{parent_key}{delimiter}{key}" if parent_key else str(key)
        if is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        elif isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, MutableMapping):
            result.update(flatten_dict(value, delimiter, new_key))
        else:
            result[new_key] = value
    return result


def sanitize_params(params: dict[str, Any]) -> dict[str, Any]:
    """Numbers, strings, bools and tensors kept; numpy scalars as Python numbers; anything else as ``str``."""
    import torch

    out: dict[str, Any] = {}
    for key, value in params.items():
        if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            out[key] = value.item()
        elif type(value) in (bool, int, float, str) or isinstance(value, torch.Tensor):
            out[key] = value
        else:
            out[key] = str(value)
    return out


def sanitize_callables(params: dict[str, Any]) -> dict[str, Any]:
    """Classes by name, callables by what they return (or their name), as Lightning's W&B logger does."""

    def one(value: Any) -> Any:
        if inspect.isclass(value):
            return value.__name__
        if callable(value):
            try:
                result = value()
            except Exception:
                return getattr(value, "__name__", None)
            return getattr(value, "__name__", None) if callable(result) else result
        return value

    return {key: one(value) for key, value in params.items()}


def add_prefix(metrics: Mapping[str, Any], prefix: str, separator: str) -> dict[str, Any]:
    """``{"loss": 1}`` -> ``{"<prefix><separator>loss": 1}`` (unchanged without a prefix)."""
    if not prefix:
        return dict(metrics)
    return {f"{prefix}{separator}{key}": value for key, value in metrics.items()}


def scan_checkpoints(checkpoint_callback: Any, logged: Mapping[str, float]) -> list[tuple[float, str, Any, str]]:
    """Checkpoint files of ``checkpoint_callback`` not uploaded yet (or rewritten since), oldest first.

    Returns ``(mtime, path, score, tag)`` tuples; ``tag`` is ``"latest"``, ``"best"`` or ``"best_k"``.
    A file counts again when its modification time is newer than when it was last logged, since
    ``last.ckpt`` keeps its name while its content changes.
    """
    found: dict[str, tuple[Any, str]] = {}
    last = getattr(checkpoint_callback, "last_model_path", "")
    if last:
        found[last] = (getattr(checkpoint_callback, "current_score", None), "latest")
    best = getattr(checkpoint_callback, "best_model_path", "")
    if best:
        found[best] = (getattr(checkpoint_callback, "best_model_score", None), "best")
    for path, score in dict(getattr(checkpoint_callback, "best_k_models", {}) or {}).items():
        found[path] = (score, "best_k")
    files = sorted(
        (Path(path).stat().st_mtime, path, score, tag) for path, (score, tag) in found.items() if Path(path).is_file()
    )
    return [item for item in files if item[1] not in logged or logged[item[1]] < item[0]]
