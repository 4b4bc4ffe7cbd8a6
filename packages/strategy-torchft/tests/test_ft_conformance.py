"""The core's conformance kit, run against ft_ddp and ft_hsdp as any vendor would run it.

The kit compares against plain PyTorch over ``devices`` ranks and checks that the Trainer's
``world_size`` equals ``devices``; in ft_ddp the Trainer's world is one replica group (the ranks
that share a process group), so the kit runs one group of two ranks (``replica_groups=1``): the
whole torchft path (local lighthouse, quorum before every step, the commit gate, the two-level
gradient average, checkpoints written by the quorum's first group) with one group. Several
groups are covered against plain PyTorch in test_ft_ddp.py. Only "popen" is supported (groups
are re-runs of the script); the kit checks that spawn and fork are refused.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from phalanx.testing import StrategyConformance


@pytest.mark.timeout(StrategyConformance.timeout + 60)  # the kit's own run timeout fires first
class TestFTDDPConformance(StrategyConformance):
    strategy = "ft_ddp"
    devices = 2
    strategy_params: ClassVar[dict[str, Any]] = {"replica_groups": 1, "timeout": 5.0, "quorum_timeout": 30.0}


@pytest.mark.timeout(StrategyConformance.timeout + 60)
class TestFTHSDPConformance(StrategyConformance):
    """ft_hsdp: FSDP2 shards inside the group; the same one-group layout as ft_ddp's kit run."""

    strategy = "ft_hsdp"
    devices = 2
    atol = 1e-5
    check_start_methods = False  # the same launcher as ft_ddp, whose kit run checks the refusals
    strategy_params: ClassVar[dict[str, Any]] = {"replica_groups": 1, "timeout": 5.0, "quorum_timeout": 30.0}
