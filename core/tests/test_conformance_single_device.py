"""The core's own single_device strategy passes the conformance kit it ships to vendors."""

from __future__ import annotations

from phalanx.testing import StrategyConformance


class TestSingleDeviceConformance(StrategyConformance):
    strategy = "single_device"
    devices = 1
    atol = 1e-6
    check_start_methods = False  # one process: nothing is launched
