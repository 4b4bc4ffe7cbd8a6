"""The core's cpu accelerator passes the accelerator kit it ships to vendors."""

from __future__ import annotations

from phalanx.testing import AcceleratorConformance


class TestCPUAcceleratorConformance(AcceleratorConformance):
    accelerator = "cpu"
    enumerable = False  # devices counts processes on cpu
