"""Checkpoints staged for ``ray.train.report``: a file, a DCP-like directory, a DeepSpeed-like tree, a URL.

``stage_for_report`` is what the callback hands Ray (Ray copies the folder into its storage), so
these tests read what it made byte for byte; the reports themselves, through a real Ray cluster,
are in test_ray_cluster.py. Only file operations here: no Ray cluster, no processes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import fsspec
import pytest

from phalanx.errors import CheckpointError
from phalanx_ray.checkpoints import STAGING_PREFIX, stage_for_report


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_file_is_linked_beside_it_under_its_own_name(tmp_path: Path) -> None:
    checkpoint = tmp_path / "epoch=0-step=4.ckpt"
    checkpoint.write_bytes(b"weights")
    staging = Path(stage_for_report(str(checkpoint)))
    try:
        assert staging.parent == tmp_path and staging.name.startswith(STAGING_PREFIX)
        assert os.listdir(staging) == [checkpoint.name]
        assert (staging / checkpoint.name).stat().st_ino == checkpoint.stat().st_ino  # linked, not copied
        checkpoint.with_suffix(".tmp").write_bytes(b"newer")
        checkpoint.with_suffix(".tmp").replace(checkpoint)  # phalanx replaces a checkpoint by rename ...
        assert (staging / checkpoint.name).read_bytes() == b"weights"  # ... the staged one is unchanged
    finally:
        shutil.rmtree(staging)


@pytest.mark.parametrize(
    "layout",
    [
        {"__0_0.distcp": b"shard 0", "__1_0.distcp": b"shard 1", ".metadata": b"plan"},  # FSDP's DCP directory
        {
            "latest": b"global_step6",
            "global_step6/mp_rank_00_model_states.pt": b"m",  # DeepSpeed's engine folder
            "global_step6/zero_pp_rank_1_mp_rank_00_optim_states.pt": b"o",
            "meta.pt": b"x",
        },
    ],
    ids=["dcp", "deepspeed"],
)
def test_a_directory_is_staged_whole(tmp_path: Path, layout: dict[str, bytes]) -> None:
    checkpoint = tmp_path / "last.ckpt"
    for name, data in layout.items():
        (checkpoint / name).parent.mkdir(parents=True, exist_ok=True)
        (checkpoint / name).write_bytes(data)
    staging = Path(stage_for_report(str(checkpoint)))
    try:
        assert os.listdir(staging) == ["last.ckpt"]
        assert _tree(staging / "last.ckpt") == _tree(checkpoint) == dict(sorted(layout.items()))
    finally:
        shutil.rmtree(staging)


def test_a_last_link_is_followed_and_keeps_its_name(tmp_path: Path) -> None:
    """ModelCheckpoint(save_last="link"): last.ckpt points at the newest top-k file."""
    (tmp_path / "epoch=0-step=8.ckpt").write_bytes(b"step 8")
    (tmp_path / "last.ckpt").symlink_to("epoch=0-step=8.ckpt")
    staging = Path(stage_for_report(str(tmp_path / "last.ckpt")))
    try:
        staged = staging / "last.ckpt"
        assert not staged.is_symlink() and staged.read_bytes() == b"step 8"
    finally:
        shutil.rmtree(staging)


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_checkpoint_at_a_url_is_downloaded(kind: str) -> None:
    """fsspec's in-memory store stands for a bucket (a real file system, not a mock)."""
    fs = fsspec.filesystem("memory")
    root = "/phalanx-ray-test/checkpoints"
    try:
        if kind == "file":
            fs.pipe(f"{root}/last.ckpt", b"weights")
            expected = {"": b"weights"}
        else:
            fs.pipe({f"{root}/last.ckpt/__0_0.distcp": b"a", f"{root}/last.ckpt/sub/__1_0.distcp": b"b",
                     f"{root}/last.ckpt/.phalanx-commit": b"{}"})  # fmt: skip
            expected = {"__0_0.distcp": b"a", "sub/__1_0.distcp": b"b", ".phalanx-commit": b"{}"}
        staging = Path(stage_for_report(f"memory://{root}/last.ckpt"))
        try:
            staged = staging / "last.ckpt"
            got = {"": staged.read_bytes()} if staged.is_file() else _tree(staged)
            assert got == dict(sorted(expected.items()))
        finally:
            shutil.rmtree(staging)
    finally:
        fs.rm("/phalanx-ray-test", recursive=True)


def test_a_missing_checkpoint_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="last.ckpt"):
        stage_for_report(str(tmp_path / "last.ckpt"))
    with pytest.raises(CheckpointError, match="never committed"):
        stage_for_report("memory://phalanx-ray-test-none/last.ckpt")
