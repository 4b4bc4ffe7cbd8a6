"""The core's conformance kit, run against this plugin as any vendor would run it.

``ddp_fork`` keeps it cheap (one torch import per run); the launch paths of ``ddp`` and
``ddp_spawn`` are covered by test_ddp_parity.py and test_ddp_failures.py.
"""

from __future__ import annotations

import pytest

from phalanx.testing import StrategyConformance


@pytest.mark.timeout(StrategyConformance.timeout + 60)  # the kit's own run timeout fires first
class TestDDPForkConformance(StrategyConformance):
    strategy = "ddp_fork"
    devices = 2
