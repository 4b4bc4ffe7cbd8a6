"""The core's conformance kit, run against single_xla on XLA:CPU (one device).

The kit runs its scripts in fresh processes; ``PJRT_DEVICE=CPU`` reaches them through the
environment (conftest sets it). xla_fsdp is covered by test_spmd.py instead: the kit expects one
process per device, while SPMD drives every device from one process.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch_xla")

from phalanx.testing import StrategyConformance


@pytest.mark.timeout(360)  # above the kit's run timeout (300 s below), which fires first
class TestSingleXLAConformance(StrategyConformance):
    strategy = "single_xla"
    accelerator = "xla"
    devices = 1
    timeout = 300.0
    check_start_methods = False  # one device in this process: nothing is launched
