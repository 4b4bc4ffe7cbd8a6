"""``lightning.pytorch.profilers.base``: :class:`PassThroughProfiler`, the profiler that records nothing.

It lives in :mod:`phalanx.profilers.profiler`, beside the :class:`~phalanx.profilers.profiler.Profiler` base class.
"""

from __future__ import annotations

from phalanx.profilers.profiler import PassThroughProfiler

__all__ = ["PassThroughProfiler"]
