"""Checkpointing on 2 real ranks: one top-k on every rank, only rank 0 writes, async saves land.

One job (scripts/checkpoint_ranks.py) forks both scenarios; the tests read what each rank
recorded and what is on disk. The async run's weights are compared with plain PyTorch computed
here (test_ddp_features.plain_two_rank_fit: the same batches, gradients averaged as DDP does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ddp_helpers import load_json, start_job
from test_ddp_features import _assert_weights, _tensors, plain_two_rank_fit

pytestmark = pytest.mark.timeout(200)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("checkpoint_ranks")
    job = start_job(directory, "checkpoint_ranks", "checkpoint_ranks.py", str(directory))
    code = job.wait(180)
    assert code == 0, job.output()
    assert not job.leftovers()
    return directory


def _ranks(out: Path, scenario: str) -> list[dict[str, Any]]:
    return [load_json(out / f"{scenario}.rank{rank}.json") for rank in (0, 1)]


def test_monitor_top_k_is_the_same_on_every_rank_when_ranks_log_different_values(out: Path) -> None:
    """Each rank logged its own ``score``; left alone, rank 0 keeps epochs {1, 3} and rank 1 {0, 3}."""
    rank0, rank1 = _ranks(out, "topk")
    assert rank0["best_k"] == rank1["best_k"], "the ranks disagree on the top-k"
    assert rank0["best"] == rank1["best"]
    assert sorted(rank0["best_k"]) == ["epoch=1.ckpt", "epoch=3.ckpt"]  # rank 0's values decide: it writes
    on_disk = sorted(p.name for p in (out / "topk").iterdir())
    assert on_disk == sorted(rank0["best_k"]), on_disk


def test_only_rank_zero_writes_and_removes(out: Path) -> None:
    for scenario in ("topk", "async"):
        rank0, rank1 = _ranks(out, scenario)
        assert rank1["calls"] == [], f"{scenario}: rank 1 wrote or removed {rank1['calls']}"
        assert rank0["calls"], scenario
    assert _ranks(out, "topk")[0]["calls"] == [
        ["save", "epoch=0.ckpt"],
        ["save", "epoch=1.ckpt"],
        ["save", "epoch=3.ckpt"],
        ["remove", "epoch=0.ckpt"],
    ]


def test_async_saves_from_two_ranks_hold_the_trained_weights(out: Path) -> None:
    """Saved on a background thread while training went on; complete when fit returned."""
    ranks = _ranks(out, "async")
    expected = plain_two_rank_fit(ranks[0]["initial"])
    for facts in ranks:
        _assert_weights(facts, expected, atol=1e-6)
    # 48 samples / 2 ranks / batch 4 = 6 steps; a save every 2 steps.
    assert sorted(p.name for p in (out / "async").iterdir()) == ["step=2.ckpt", "step=4.ckpt", "step=6.ckpt"]
    steps = [torch.load(out / "async" / f"step={s}.ckpt", weights_only=True) for s in (2, 4, 6)]
    assert [c["global_step"] for c in steps] == [2, 4, 6]
    final = steps[-1]["state_dict"]
    for key, value in _tensors(ranks[0]["final"], expected).items():
        assert torch.equal(final[key], value), f"{key}: the last async checkpoint is not the trained weights"
    assert not torch.equal(steps[0]["state_dict"]["net.0.weight"], final["net.0.weight"])  # a snapshot, not a reference
