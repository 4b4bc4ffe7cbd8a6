"""Publishing checkpoint directories atomically, and "last" skipping what a killed writer left."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.checkpoint_io.atomic import is_staging_name, prepare_staging, publish_directory, staging_directory
from phalanx.environments.local import LocalEnvironment
from phalanx.strategies.parallel import ParallelStrategy
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


class _KeptElsewhere(LocalEnvironment):
    """A scheduler that keeps a checkpoint of the run outside the Trainer's directories (as Ray
    Train does); everything else as the local environment."""

    def __init__(self, kept: str | None) -> None:
        super().__init__()
        self.kept = kept

    def last_checkpoint(self) -> str | None:
        return self.kept


def _trainer_on(root: Path, kept: str | None) -> Trainer:
    return Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ParallelStrategy(cluster_environment=_KeptElsewhere(kept)),
        logger=False,
        enable_progress_bar=False,
        default_root_dir=str(root),
        callbacks=[ModelCheckpoint(dirpath=str(root / "ckpts"))],
    )


def test_last_takes_the_scheduler_s_checkpoint_where_it_is_the_newest(tmp_path: Path) -> None:
    """ckpt_path="last" weighs the checkpoint the cluster environment keeps (a restart on a node
    that never saw the run has only that one) with the Trainer's own; the newest wins."""
    kept = tmp_path / "elsewhere" / "checkpoint_000001" / "last.ckpt"
    kept.parent.mkdir(parents=True)
    torch.save({"state_dict": {}}, kept)
    assert find_last_checkpoint(_trainer_on(tmp_path, str(kept))) == str(kept)  # nothing local: the kept one
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    torch.save({"state_dict": {}}, ckpts / "epoch=0-step=8.ckpt")
    os.utime(kept, ns=(1, 1))  # the local one is newer
    assert find_last_checkpoint(_trainer_on(tmp_path, str(kept))) == str(ckpts / "epoch=0-step=8.ckpt")
    assert find_last_checkpoint(_trainer_on(tmp_path, None)) == str(ckpts / "epoch=0-step=8.ckpt")
    os.utime(kept)  # now the kept one is the newest
    assert find_last_checkpoint(_trainer_on(tmp_path, str(kept))) == str(kept)
