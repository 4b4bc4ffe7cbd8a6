"""ft_hsdp trains for real: FSDP2 over the two ranks of each replica group, torchft across two groups.

The reference is the same plain-PyTorch replay as for ft_ddp (``ft_common.replay``): Adam steps on
the mean gradient of the batches of the ranks that took part. Each rank writes the shapes of its
local shards, so the tests also check that the Module really was sharded inside each group (rank
1 of the 16->1 layer holds an empty shard: FSDP2 splits dim 0, and it has one row).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ft_helpers import assert_same, committed_steps, load_json, replay, start_fit, weights

#: Holds wall-clock bounds: under xdist it runs with the machine to itself (phalanx.testing.scheduling).
pytestmark = pytest.mark.timing

TIMEOUT = 3.0  # seconds a collective waits for a dead group (and the lighthouse's heartbeat timeout)
#: Local shard shapes on ranks 0 and 1 of a group (the full shapes: 16x8, 16, 1x16, 1).
SHARDS = {
    0: {"net.0.weight": [8, 8], "net.0.bias": [8], "net.2.weight": [1, 16], "net.2.bias": [1]},
    1: {"net.0.weight": [8, 8], "net.0.bias": [8], "net.2.weight": [0, 16], "net.2.bias": [0]},
}


def _results(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    return {(g, r): load_json(out / f"group{g}_rank{r}.json") for g in (0, 1) for r in (0, 1)}


@pytest.mark.timeout(180)
def test_two_sharded_groups_of_two_ranks_match_plain_ddp_over_four_ranks(tmp_path: Path) -> None:
    """FSDP2 averages each gradient over its group's 2 ranks (reduce-scatter), torchft averages each
    rank's shard over the 2 groups: every step is the mean over all 4 ranks' batches. Each Linear is
    its own FSDP2 unit here (``auto_wrap_policy``); the failure test below runs the whole Module as
    one unit."""
    job = start_fit(tmp_path, 2, hsdp=True, wrap_linear=True, devices=2, timeout=TIMEOUT, quorum_timeout=60)
    assert job.wait(150) == 0, job.output()
    results = _results(tmp_path)
    log = results[0, 0]["commit_log"]
    assert len(log) == 6 and all(e["committed"] and e["participants"] == 2 for e in log)
    reference = replay(committed_steps(log, {2: [0, 1, 2, 3]}), world=4)
    for (_, rank), result in results.items():
        assert result["sharded"] == SHARDS[rank]
        assert [(e["global_step"], e["committed"]) for e in result["commit_log"]] == [
            (e["global_step"], e["committed"]) for e in log
        ]
        assert result["global_step"] == 6
        assert_same(weights(result, reference), reference)
    assert not job.leftovers()


@pytest.mark.timeout(200)
def test_killed_sharded_group_is_dropped_restarted_and_healed_rank_by_rank(tmp_path: Path) -> None:
    """kill -9 both ranks of group 1 in step 4 (after the quorum, before the all-reduce).

    The commits are ft_ddp's (docs/torchft.md): steps 0-3 with both groups, step 4 dropped
    everywhere, then group 0 alone (the mean over its 2 ranks) until group 1, restarted, heals at
    the start of step h: each of its ranks receives the shards of the same rank of group 0 (rank 1's
    state is smaller: its shard of the last layer is empty), and from step h both commit together.
    While alone, the survivor sleeps 1 s per step: the restart has up to 19 steps (about 20 s) to
    find it still training, while the steps before and after cost no waiting. The restarted group
    waits for the survivor's first step alone (``heal_after_alone``), as in test_ft_ddp.py: a
    restart back within the stall would otherwise join step 5 and no step would run alone.
    """
    job = start_fit(
        tmp_path, 8, hsdp=True, devices=2, timeout=TIMEOUT, quorum_timeout=60, kill_group=1, kill_step=4,
        alone_sleep=1.0, heal_after_alone=True,
    )  # fmt: skip
    assert job.wait(180) == 0, job.output()
    results = _results(tmp_path)
    survivor = results[0, 0]
    assert survivor["events"] and "replica group 1 exited with code -9; restarting" in survivor["events"][0]
    log = survivor["commit_log"]
    assert [e["committed"] for e in log[:5]] == [True, True, True, True, False]
    alone = [e for e in log if e["committed"] and e["participants"] == 1]
    assert alone and alone[0]["global_step"] == 5, "the survivor kept stepping alone right after the failure"
    stall = alone[0]["seconds"]  # later steps alone sleep alone_sleep on purpose
    assert stall <= 2 * TIMEOUT, f"survivor stalled {stall:.1f}s (> 2 x timeout)"
    heals = [results[1, rank]["heal_log"][-1] for rank in (0, 1)]
    assert heals[0]["global_step"] == heals[1]["global_step"] > 5
    assert heals[0]["bytes"] > heals[1]["bytes"], "each rank received its own shard, not the whole state"
    rejoined = [e for e in log if e["global_step"] >= heals[0]["global_step"]]
    assert rejoined and all(e["committed"] and e["participants"] == 2 for e in rejoined)
    reference = replay(committed_steps(log, {2: [0, 1, 2, 3], 1: [0, 1]}), world=4)
    for (_, rank), result in results.items():
        assert result["global_step"] == 24
        assert result["sharded"] == SHARDS[rank]
        assert_same(weights(result, reference), reference)
    print(
        f"stall {stall:.2f}s; group 1 healed at step {heals[0]['global_step']} ({heals[0]['bytes']} + {heals[1]['bytes']} bytes)"
    )
