"""The core's conformance kit, run against this plugin as any vendor would run it.

The kit runs every start method DDPStrategy accepts (popen, spawn, fork), save -> resume,
evaluation after fit and a failing rank; the memory check compares the plugin's
``phalanx_estimate_memory`` answer with what each rank really holds.
"""

from __future__ import annotations

import pytest

from phalanx.testing import StrategyConformance
from phalanx.testing.memory import MemoryConformance


@pytest.mark.timeout(StrategyConformance.timeout + 60)  # the kit's own run timeout fires first
class TestDDPForkConformance(StrategyConformance, MemoryConformance):
    strategy = "ddp_fork"
    memory_strategy = "ddp"  # measured in the ranks' own processes
    devices = 2
