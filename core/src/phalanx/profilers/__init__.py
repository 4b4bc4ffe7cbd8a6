"""Profilers: where the time of a run goes, per hook, step and data fetch.

``Trainer(profiler=...)`` takes ``None`` (no profiling), ``"simple"``, ``"advanced"``,
``"pytorch"`` or a :class:`Profiler` instance; :func:`resolve_profiler` is that mapping. Names and
reports follow Lightning's ``lightning.pytorch.profilers``.

Importing this package does not import torch: :class:`PyTorchProfiler` is resolved on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from phalanx.errors import MisconfigurationError, closest_match
from phalanx.profilers.advanced import AdvancedProfiler
from phalanx.profilers.profiler import PassThroughProfiler, Profiler
from phalanx.profilers.simple import SimpleProfiler

if TYPE_CHECKING:
    from phalanx.profilers.pytorch import PyTorchProfiler

__all__ = [
    "AdvancedProfiler",
    "PassThroughProfiler",
    "Profiler",
    "PyTorchProfiler",
    "SimpleProfiler",
    "resolve_profiler",
]

#: The names ``Trainer(profiler=...)`` accepts, and the class each builds (with default arguments).
PROFILERS: dict[str, str] = {
    "simple": "phalanx.profilers.simple:SimpleProfiler",
    "advanced": "phalanx.profilers.advanced:AdvancedProfiler",
    "pytorch": "phalanx.profilers.pytorch:PyTorchProfiler",
}


def resolve_profiler(value: Profiler | str | None) -> Profiler:
    """Turn ``Trainer(profiler=value)`` into a Profiler.

    Args:
        value: ``None`` (a :class:`PassThroughProfiler`, which costs nothing), one of
            :data:`PROFILERS` (any case), or a :class:`Profiler` instance (returned as is).

    Raises:
        MisconfigurationError: Any other value; the message lists the accepted ones.
    """
    if value is None:
        return PassThroughProfiler()
    if isinstance(value, Profiler):
        return value
    if isinstance(value, str) and value.lower() in PROFILERS:
        module, _, name = PROFILERS[value.lower()].partition(":")
        profiler: Profiler = getattr(importlib.import_module(module), name)()
        return profiler
    close = closest_match(value.lower(), PROFILERS) if isinstance(value, str) else None
    hint = f" (did you mean {close!r}?)" if close else ""
    msg = (
        f"Trainer(profiler={value!r}) is not a profiler{hint}: pass None, one of {sorted(PROFILERS)}, "
        "or an instance of phalanx.profilers.Profiler (e.g. SimpleProfiler(dirpath=..., filename=...))"
    )
    raise MisconfigurationError(msg)


def __getattr__(name: str) -> Any:
    if name == "PyTorchProfiler":
        from phalanx.profilers.pytorch import PyTorchProfiler

        return PyTorchProfiler
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
