"""Sharded and full checkpoints: exact resume, resharding 2 -> 1 -> 2 ranks, conversion, mismatch.

The chain: a 2-rank run writes a sharded checkpoint after epoch 0 and a full file after epoch 1; a
1-rank run loads the sharded one (resharding) and re-saves it sharded from one rank, loads the full
file, and refuses a checkpoint of another model; a 2-rank run resumes epoch 1 from the 1-rank
checkpoint. Its losses must equal the uninterrupted run's, which needs the weights *and* the
optimizer state to survive both reshardings exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fsdp_testing import pytest_timeout_for, read_ranks

# The resumed run needs the whole chain: reference, 2-rank run, 1-rank reshard, 2-rank resume.
pytestmark = pytest.mark.timeout(pytest_timeout_for(runs=4))

ATOL = 1e-5


def test_sharded_checkpoint_is_a_directory_with_one_shard_per_rank(fsdp_run: Path) -> None:
    ckpt = fsdp_run / "run1_epoch0"
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    meta = torch.load(ckpt / "meta.pt", weights_only=True)
    assert meta["dcp"]["world_size"] == 2 and meta["dcp"]["strategy"] == "fsdp"
    assert meta["global_step"] == 3


def test_two_rank_sharded_checkpoint_loads_on_one_rank(resharded_run: Path) -> None:
    [result] = read_ranks(resharded_run, "run2", world_size=1)
    assert result["verify_max_error"] is not None and result["verify_max_error"] <= ATOL
    assert result["losses"] == []  # max_steps reached: loaded, nothing trained
    resaved = resharded_run / "run2_resharded"
    assert sorted(p.name for p in resaved.iterdir()) == [".metadata", "__0_0.distcp", "meta.pt"]


def test_full_checkpoint_file_loads_into_sharded_model(resharded_run: Path) -> None:
    """The full file (position-keyed, like a ddp checkpoint) is sharded into a 1-rank fsdp model."""
    [result] = read_ranks(resharded_run, "run2", world_size=1)
    assert result["full_file_max_error"] is not None and result["full_file_max_error"] <= ATOL
    full = torch.load(resharded_run / "run1_epoch1", weights_only=True)
    assert full["optimizer_states"][0]["param_groups"][0]["params"] == list(range(6))


def test_checkpoint_of_another_model_is_refused(resharded_run: Path) -> None:
    [result] = read_ranks(resharded_run, "run2", world_size=1)
    error = result["mismatch_error"]
    assert error is not None, "loading a checkpoint of another model did not fail"
    assert "does not fit the model Net" in error
    assert "net.0.linear.weight: checkpoint (16, 8) vs model (32, 8)" in error


def test_resume_after_resharding_reproduces_the_uninterrupted_run(resumed_run: Path) -> None:
    straight = read_ranks(resumed_run, "run1")
    for rank, result in enumerate(read_ranks(resumed_run, "run3")):
        expected = straight[rank]["losses"][6:]
        assert len(result["losses"]) == len(expected) == 6
        worst = max(abs(a - b) for a, b in zip(result["losses"], expected))
        assert worst <= ATOL, f"rank {rank}: resumed losses differ by {worst:.3g}"
        assert result["global_step"] == 6


def test_convert_turns_shards_into_the_weights_ddp_trained(resumed_run: Path, tmp_path: Path) -> None:
    """`phalanx checkpoint convert` on the final sharded checkpoint == plain DDP's final weights."""
    from phalanx.cli import main

    destination = tmp_path / "portable.pt"
    assert main(["checkpoint", "convert", str(resumed_run / "run3_epoch1"), str(destination)]) == 0
    portable = torch.load(destination, weights_only=True)
    reference = torch.load(resumed_run / "ref_weights.pt", weights_only=True)[1]
    assert set(portable["state_dict"]) == {f"net.{key}" for key in reference}
    for key, value in reference.items():
        torch.testing.assert_close(portable["state_dict"][f"net.{key}"], value, atol=ATOL, rtol=0)
    assert portable["global_step"] == 6
    # and the portable file is an ordinary torch file a plain model loads
    from common import make_net

    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in portable["state_dict"].items()})
