"""ft_diloco trains for real: a lighthouse, two replica groups of one rank, gloo, a group killed between syncs.

The reference is plain PyTorch (``ft_common.diloco_replay``): each group trains its own copy with
its own inner optimizer on its shard; at each sync the groups named by the survivor's record
average their pseudo-gradients (global minus local weights) and Nesterov SGD (lr 0.7, momentum
0.9) steps the global weights of the fragment whose turn it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ft_helpers import assert_same, diloco_replay, load_json, start_fit, weights

TIMEOUT = 3.0  # seconds a collective waits for a dead group (and the lighthouse's heartbeat timeout)
FRAGMENTS = [["net.0.weight"], ["net.0.bias", "net.2.weight", "net.2.bias"]]  # 128 of 161 elements, then the rest


def _syncs(log: list[dict[str, Any]], groups: dict[int, list[int]]) -> list[tuple[bool, list[int]]]:
    return [(e["committed"], groups[e["participants"]]) for e in log]


@pytest.mark.timeout(150)
def test_streaming_diloco_matches_plain_pytorch_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """2 groups, AdamW inside, ``sync_every=4`` over 2 fragments (one syncs every 2 inner steps),
    each all-reduce overlapping 1 inner step (``fragment_sync_delay=1``); 12 inner steps.

    Each group seeds its Module differently: the replay starts both from group 0's weights, which
    every group takes at a local run's start. One job checks: the fragments and the order they
    sync in; both groups' weights against the
    replay (they differ from each other: fragment 0 last synced 2 steps before the end); the
    checkpoint written after step 8 (the global weights, the outer momentum, the writer's local
    weights, the local step and torchft's step); and a second fit resumed from it, which gives
    every group the writer's state (as torchft's heal does) and matches a replay started there.
    """
    options = {"sync_every": 4, "num_fragments": 2, "fragment_sync_delay": 1}
    job = start_fit(tmp_path, 2, diloco=options, inner="adamw", timeout=TIMEOUT, quorum_timeout=60,
                    save_at_step=8, resume=True, seed_by_group=True)  # fmt: skip
    assert job.wait(120) == 0, job.output()
    results = [load_json(tmp_path / f"group{g}_rank0.json") for g in (0, 1)]
    log = results[0]["commit_log"]
    assert [(e["global_step"], e["fragment"], e["committed"], e["participants"], e["ft_step"]) for e in log] == [
        (step, k % 2, True, 2, k + 1) for k, step in enumerate((1, 3, 5, 7, 9, 11))
    ]
    kwargs = {"sync_every": 4, "fragments": FRAGMENTS, "delay": 1, "inner": "adamw"}
    reference = diloco_replay(12, _syncs(log, {2: [0, 1]}), world=2, **kwargs)
    for group, result in enumerate(results):
        assert result["fragments"] == FRAGMENTS
        assert result["commit_log"] == [{**e, "seconds": f["seconds"]} for e, f in zip(log, result["commit_log"])]
        assert result["global_step"] == 12
        assert_same(weights(result, reference["groups"][group]), reference["groups"][group])
    ours, theirs = (weights(r, reference["groups"][0]) for r in results)
    assert not torch.allclose(ours["net.0.weight"], theirs["net.0.weight"], atol=1e-4)  # local steps since its sync
    assert torch.equal(ours["net.2.weight"], theirs["net.2.weight"])  # fragment 1 synced at the last step

    checkpoint = torch.load(tmp_path / "mid.ckpt", weights_only=True)
    at_save = diloco_replay(8, _syncs(log[:4], {2: [0, 1]}), world=2, **kwargs)
    state = checkpoint["diloco"]
    assert (state["local_step"], state["manager"]["step"], state["fragments"]) == (0, 4, FRAGMENTS)
    assert_same(state["original_parameters"], at_save["global"])
    assert_same(checkpoint["state_dict"], at_save["groups"][0])
    for saved, expected in zip(state["outer_optimizers"], at_save["outer"]):
        for index, entry in expected["state"].items():
            torch.testing.assert_close(
                saved["state"][index]["momentum_buffer"], entry["momentum_buffer"], atol=1e-6, rtol=0
            )

    resumed = [load_json(tmp_path / f"group{g}_rank0_resumed.json") for g in (0, 1)]
    rlog = resumed[0]["commit_log"]
    assert [(e["global_step"], e["fragment"], e["ft_step"], e["participants"]) for e in rlog] == [
        (9, 0, 5, 2),
        (11, 1, 6, 2),
    ]
    restarted = diloco_replay(12, _syncs(rlog, {2: [0, 1]}), world=2, resume=(8, checkpoint), **kwargs)
    for group, result in enumerate(resumed):
        assert result["global_step"] == 12
        assert_same(weights(result, restarted["groups"][group]), restarted["groups"][group])
    assert not job.leftovers()


@pytest.mark.timing  # bounds the survivor's stall: under xdist it runs with the machine to itself
@pytest.mark.timeout(200)
def test_group_killed_between_syncs_loses_only_its_inner_steps_and_heals_at_a_sync(tmp_path: Path) -> None:
    """Plain DiLoCo (``sync_every=2``, SGD inside), 24 inner steps: kill -9 group 1 before its inner
    step 5, once group 0 has committed the sync after step 3 (``kill_after_sync``: the syncs before
    the kill include group 1 on every run).

    The survivor's sync after step 5 waits for group 1's heartbeat to stop (about ``timeout``),
    then commits alone with its own pseudo-gradient; group 1's inner step 4 is lost with it. Group
    1, restarted, waits for that sync alone (``heal_after_alone``), trains its first 2 steps, then
    heals at the survivor's next sync (weights, optimizer states, torchft's step) and sends the
    same pseudo-gradient; from then on both commit together. While alone the survivor waits for
    the restarted group to have set up its fit (``wait_for_restart``), so the heal comes within a
    sync or two however slow the restart is. The survivor ends with the weights of the replay of
    exactly those syncs, whichever sync the heal came at.
    """
    job = start_fit(tmp_path, 4, diloco={"sync_every": 2}, inner="sgd", timeout=TIMEOUT, quorum_timeout=60,
                    max_restarts=1, kill_group=1, kill_step=5, kill_after_sync=2, heal_after_alone=True,
                    wait_for_restart=True)  # fmt: skip
    assert job.wait(180) == 0, job.output()
    survivor, healed = (load_json(tmp_path / f"group{g}_rank0.json") for g in (0, 1))
    log = survivor["commit_log"]
    seen = (
        f"survivor syncs (step, committed, groups, seconds): "
        f"{[(e['global_step'], e['committed'], e['participants'], round(e['seconds'], 2)) for e in log]}; "
        f"events {survivor['events']}; heal {healed['heal_log']}"
    )
    assert survivor["events"] == [
        "replica group 1 exited with code -9; restarting it (1/1), it heals from a live group"
    ], seen
    assert all(e["committed"] for e in log) and [e["global_step"] for e in log] == list(range(1, 24, 2)), seen
    assert [e["participants"] for e in log[:3]] == [2, 2, 1], seen
    stall = log[2]["seconds"]
    assert stall <= 2 * TIMEOUT + 1.0, f"the survivor's first sync alone took {stall:.1f}s (> 2 x timeout): {seen}"
    back = next((i for i, e in enumerate(log) if i > 2 and e["participants"] == 2), None)
    assert back is not None and all(e["participants"] == 2 for e in log[back:]), seen
    assert all(e["participants"] == 1 for e in log[2:back]), seen
    (heal,) = healed["heal_log"]
    first = healed["commit_log"][0]
    assert (heal["ft_step"], heal["global_step"]) == (log[back - 1]["ft_step"], log[back]["global_step"]), seen
    assert (first["committed"], first["participants"], first["ft_step"], first["global_step"]) == (
        True, 2, log[back]["ft_step"], 1
    ), seen  # fmt: skip
    assert survivor["global_step"] == 24, seen
    reference = diloco_replay(
        24, _syncs(log, {2: [0, 1], 1: [0]}), world=2, sync_every=2, fragments=[[n for f in FRAGMENTS for n in f]],
        inner="sgd", heal=(log[back]["global_step"], first["global_step"]),
    )  # fmt: skip
    assert_same(weights(survivor, reference["groups"][0]), reference["groups"][0])
    print(f"the survivor's first sync alone took {stall:.2f}s; group 1 healed at step {heal['global_step']}")
