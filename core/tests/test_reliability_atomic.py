"""Publishing checkpoint directories atomically, and "last" skipping what a killed writer left."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.checkpoint_io.atomic import is_staging_name, prepare_staging, publish_directory, staging_directory
from phalanx.trainer.checkpointing import find_last_checkpoint


def _trainer(root: Path) -> Trainer:
    return Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        default_root_dir=str(root),
        callbacks=[ModelCheckpoint(dirpath=str(root / "ckpts"))],
    )


def test_publish_swaps_an_existing_directory_whole(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    target.mkdir()
    (target / "old").write_text("old")
    staging = prepare_staging(target)
    assert staging == staging_directory(target) and is_staging_name(staging.name)
    (staging / "new").write_text("new")
    publish_directory(staging, target)
    assert sorted(os.listdir(target)) == ["new"]
    assert not staging.exists()


def test_publish_replaces_a_file_and_creates_new_targets(tmp_path: Path) -> None:
    target = tmp_path / "a.ckpt"
    target.write_bytes(b"file")
    staging = prepare_staging(target)
    (staging / "x").write_text("x")
    publish_directory(staging, target)
    assert target.is_dir() and (target / "x").exists()
    fresh = tmp_path / "b.ckpt"
    staging = prepare_staging(fresh)
    (staging / "y").write_text("y")
    publish_directory(staging, fresh)
    assert (fresh / "y").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ckpt", "b.ckpt"]


def test_last_skips_partial_entries_a_killed_writer_leaves(tmp_path: Path) -> None:
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    torch.save({"state_dict": {}}, ckpts / "epoch=0-step=2.ckpt")
    time.sleep(0.01)
    (ckpts / ".last.ckpt.partial").mkdir()  # an unfinished sharded save
    (ckpts / ".last.ckpt.partial" / "__0_0.distcp").write_bytes(b"x")
    (ckpts / ".last.ckpt.abc123.tmp").write_bytes(b"half")  # an unfinished single-file save
    (ckpts / "empty.ckpt").mkdir()
    (ckpts / "zero.ckpt").write_bytes(b"")
    assert find_last_checkpoint(_trainer(tmp_path)) == str(ckpts / "epoch=0-step=2.ckpt")
