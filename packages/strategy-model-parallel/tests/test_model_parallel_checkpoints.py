"""Distributed checkpoints: exact resume at other mesh shapes, consolidated files, convert, mismatch.

A (2 x 2) run writes a DCP directory after epoch 0; (4 x 1) and (1 x 2) runs resume from it and
must continue with the uninterrupted run's losses (global-batch losses, since the data-parallel
split changes), which needs weights and momentum to survive the resharding exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mp_common import single_process_weights
from mp_testing import read_ranks

pytestmark = pytest.mark.timeout(300)

ATOL = 1e-5


def test_distributed_checkpoint_is_a_directory_with_one_shard_file_per_rank(mesh_2x2: Path) -> None:
    ckpt = mesh_2x2 / "ckpt22"
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", *[f"__{r}_0.distcp" for r in range(4)], "meta.pt"]
    meta = torch.load(ckpt / "meta.pt", weights_only=True)
    assert meta["dcp"]["strategy"] == "model_parallel" and meta["dcp"]["world_size"] == 4
    assert meta["dcp"]["layout"] == {
        "data_parallel": 2,
        "data_parallel_replicate": 1,
        "context_parallel": 1,
        "tensor_parallel": 2,
        "pipeline_parallel": 1,
    }
    assert meta["global_step"] == 8 and "state_dict" not in meta


@pytest.mark.parametrize(("fixture", "tag", "world"), [("mesh_4x1", "r41", 4), ("mesh_1x2", "r12", 2)])
def test_resume_at_another_mesh_shape_continues_the_uninterrupted_run(
    request: pytest.FixtureRequest, fixture: str, tag: str, world: int
) -> None:
    out = request.getfixturevalue(fixture)
    straight = read_ranks(out, "t22", 4)[0]["global_losses"][8:]
    for result in read_ranks(out, tag, world):
        assert result["global_step"] == 16
        worst = max(abs(a - b) for a, b in zip(result["global_losses"], straight))
        assert len(result["global_losses"]) == 8 and worst <= ATOL, f"{tag}: resumed losses differ by {worst:.3g}"


def test_consolidated_file_loads_at_another_mesh_shape(mesh_4x1: Path) -> None:
    full = torch.load(mesh_4x1 / "full22.pt", weights_only=True)
    assert full["optimizer_states"][0]["param_groups"][0]["params"][0] == "net.0.w1.weight"  # keyed by name
    loaded = torch.load(mesh_4x1 / "full41_weights_rank0.pt", weights_only=True)
    for key, value in full["state_dict"].items():
        torch.testing.assert_close(loaded[key], value, atol=0, rtol=0)


@pytest.mark.parametrize(("fixture", "name", "epochs"), [("mesh_2x2", "ckpt22", 1), ("pipeline_2", "ckpt_pp", 2)])
def test_convert_turns_shards_and_stages_into_one_portable_file(
    request: pytest.FixtureRequest, fixture: str, name: str, epochs: int, tmp_path: Path
) -> None:
    """`phalanx checkpoint convert` gathers TP slices, FSDP shards and pipeline stages into full weights."""
    from phalanx.cli import main

    out = request.getfixturevalue(fixture)
    destination = tmp_path / "portable.pt"
    assert main(["checkpoint", "convert", str(out / name), str(destination)]) == 0
    portable = torch.load(destination, weights_only=True)
    reference = single_process_weights(epochs)
    assert set(portable["state_dict"]) == {f"net.{k}" for k in reference}
    for key, value in reference.items():
        torch.testing.assert_close(portable["state_dict"][f"net.{key}"], value, atol=1e-4, rtol=0)


def test_checkpoint_of_another_model_is_refused(mesh_1x2: Path) -> None:
    for result in read_ranks(mesh_1x2, "mismatch", 2):
        error = result["error"]
        assert error.startswith("CheckpointError") and "does not fit the model Net" in error
        assert "net.0.w1.weight: checkpoint (16, 8) vs model (32, 8)" in error
