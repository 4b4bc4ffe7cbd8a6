"""Accelerators: which hardware a strategy runs on (cpu, cuda, mps, and plugin-provided ones)."""

from __future__ import annotations

from phalanx.accelerators.accelerator import Accelerator
from phalanx.accelerators.cpu import CPUAccelerator
from phalanx.accelerators.cuda import CUDAAccelerator
from phalanx.accelerators.mps import MPSAccelerator

__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator"]
