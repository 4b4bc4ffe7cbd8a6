"""Accelerators: which hardware a strategy runs on (cpu, cuda, mps, and plugin-provided ones)."""

from __future__ import annotations

from typing import Any

from phalanx.accelerators.accelerator import Accelerator
from phalanx.accelerators.cpu import CPUAccelerator
from phalanx.accelerators.cuda import CUDAAccelerator, find_usable_cuda_devices
from phalanx.accelerators.mps import MPSAccelerator

__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator", "find_usable_cuda_devices"]


def __getattr__(name: str) -> Any:
    """``XLAAccelerator`` (Lightning's name) from the ``phalanx-strategy-xla`` package when installed."""
    if name == "XLAAccelerator":
        from phalanx._registered_classes import registered_class

        return registered_class(name, module=__name__)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
