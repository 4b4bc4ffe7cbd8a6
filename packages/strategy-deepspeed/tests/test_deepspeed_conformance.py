"""The core's conformance kit against deepspeed_stage_2, as a vendor would run it (real DeepSpeed, CPU).

DeepSpeed starts its ranks by re-running the script only (``popen``), which the kit's start-method
check confirms: spawn and fork are refused at construction. ZeRO-2 keeps fp32 master weights and
reduces gradients in buckets, so fit and resume are compared within 1e-5 rather than bit for bit.
"""

from __future__ import annotations

import os

import pytest

from phalanx.testing import StrategyConformance

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the kit's runs inherit it


@pytest.mark.timeout(StrategyConformance.timeout + 60)  # the kit's own run timeout fires first
class TestDeepSpeedStage2Conformance(StrategyConformance):
    strategy = "deepspeed_stage_2"
    devices = 2
    atol = 1e-5
    resume_atol = 1e-5
