"""ft_ddp, ft_hsdp and ft_diloco are registered through the ``phalanx`` entry point, costs no torch import to list, and
answers ``phalanx plan`` (memory) like the other plugins. (``phalanx doctor --strategy ft_ddp``
runs a real 2 groups x 2 ranks fit, about 35 s here; it is left to the doctor's own runs to keep
this suite within CI's budget.)"""

from __future__ import annotations

import subprocess
import sys

from phalanx_strategy_torchft import FTDDPStrategy

from phalanx.registry import StrategyRegistry
from phalanx.testing.memory import planned


def test_registered_with_its_requirements() -> None:
    entry = StrategyRegistry.entry("ft_ddp")
    assert entry.target_path == "phalanx_strategy_torchft.strategy:FTDDPStrategy"
    assert "torchft>=0.2" in entry.requires
    assert entry.available, entry.unavailable_reason()
    strategy = StrategyRegistry.get("ft_ddp", replica_groups=3, min_replicas=2, quorum_timeout=5)
    assert isinstance(strategy, FTDDPStrategy)
    assert (strategy.replica_groups, strategy.min_replicas, strategy.quorum_timeout.total_seconds()) == (3, 2, 5.0)


def test_plugin_module_imports_no_torch() -> None:
    code = "import sys, phalanx_strategy_torchft._plugin, phalanx_strategy_torchft; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def _float32_bytes(width: int) -> int:
    """The probe model's float32 parameter bytes, counted on a real instance."""
    from phalanx.testing.memory_probe import build

    return 4 * sum(p.numel() for p in build(width).parameters())


def test_plan_estimates_a_replica_per_rank_like_ddp() -> None:
    """A full replica per rank, as ddp (this session installs no other strategy package to compare with)."""
    ft, full = planned("ft_ddp", width=64, devices=2), _float32_bytes(64)
    assert ft is not None
    assert (ft.parameters, ft.gradients, ft.optimizer_states) == (full, full, 2 * full)  # AdamW: two moments
    assert ft.other == ft.gradients  # DDP's buckets: a second copy of the gradients


def test_ft_hsdp_registered_and_planned_as_shards_like_fsdp() -> None:
    from phalanx_strategy_torchft import FTHSDPStrategy

    entry = StrategyRegistry.entry("ft_hsdp")
    assert entry.target_path == "phalanx_strategy_torchft.hsdp:FTHSDPStrategy"
    assert "torchft>=0.2" in entry.requires
    strategy = StrategyRegistry.get("ft_hsdp", replica_groups=3, min_replicas=2)
    assert isinstance(strategy, FTHSDPStrategy) and strategy.replica_groups == 3
    ft, full = planned("ft_hsdp", width=64, devices=2), _float32_bytes(64)
    assert ft is not None
    assert (ft.parameters, ft.gradients, ft.optimizer_states) == (full // 2, full // 2, full)  # a shard per rank
    assert ft.other == ft.gradients  # the flat shard torchft all-reduces
    assert ft.transient == 2 * full  # the whole model (one unit) gathered, with its unsharded gradients


def test_ft_diloco_registered_and_planned_with_the_global_copy_and_outer_momentum() -> None:
    from phalanx_strategy_torchft import FTDiLoCoStrategy

    entry = StrategyRegistry.entry("ft_diloco")
    assert entry.target_path == "phalanx_strategy_torchft.diloco:FTDiLoCoStrategy"
    assert "torchft>=0.2" in entry.requires
    strategy = StrategyRegistry.get("ft_diloco", sync_every=10, num_fragments=2)
    assert isinstance(strategy, FTDiLoCoStrategy) and (strategy.sync_every, strategy.num_fragments) == (10, 2)
    listed = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "strategies", "--json"], capture_output=True, text=True, timeout=60
    )
    assert '"ft_diloco"' in listed.stdout, listed.stderr[-2000:]
    diloco, ddp, full = (
        planned("ft_diloco", width=64, devices=2),
        planned("ft_ddp", width=64, devices=2),
        _float32_bytes(64),
    )
    assert diloco is not None and ddp is not None
    assert (diloco.parameters, diloco.gradients, diloco.other) == (ddp.parameters, ddp.gradients, ddp.other)
    assert diloco.optimizer_states == ddp.optimizer_states + full  # the outer Nesterov momentum
    assert diloco.cpu == full  # the global weights of the last sync, in host memory
