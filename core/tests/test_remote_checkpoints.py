"""Checkpoints and logs on an fsspec store (``memory://``): commit markers, "last", resume, top-k.

``memory://`` is fsspec's in-process object store: fast, and like S3 it has no rename, so every
remote code path (staging prefixes, commit markers, listing, removal) runs for real here. The same
behaviour against a real S3 API server is tested in ``tests/remote/``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest
import torch
from trainer_helpers import Net, loader, plain_fit

from phalanx import Trainer
from phalanx.callbacks import ModelCheckpoint
from phalanx.checkpoint_io import TorchCheckpointIO
from phalanx.checkpoint_io.atomic import (
    COMMIT_MARKER,
    committed_path,
    prepare_staging,
    publish_directory,
    staging_directory,
)
from phalanx.errors import CheckpointError
from phalanx.loggers import CSVLogger
from phalanx.trainer.checkpointing import find_last_checkpoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def root() -> Iterator[str]:
    """A fresh ``memory://`` prefix, removed afterwards (the store lives as long as the process)."""
    fs = fsspec.filesystem("memory")
    name = f"/run-{uuid.uuid4().hex[:8]}"
    yield f"memory://{name}"
    if fs.exists(name):
        fs.rm(name, recursive=True)


def _memory() -> Any:
    return fsspec.filesystem("memory")


def _inner(url: str) -> str:
    return url[len("memory://") :]


def _write_dir(url: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        _memory().pipe_file(f"{_inner(url)}/{name}", data)


def _files(url: str) -> dict[str, bytes]:
    fs, inner = _memory(), _inner(url)
    return {path[len(inner) + 1 :]: fs.cat_file(path) for path in fs.find(inner)}


# ---------------------------------------------------------------------- the commit protocol
def test_publish_commits_a_directory_and_replaces_the_previous_one(root: str) -> None:
    target = f"{root}/last.ckpt"
    staging = prepare_staging(target)
    assert isinstance(staging, str) and staging == staging_directory(target) == f"{root}/.last.ckpt.partial"
    _write_dir(staging, {"a.distcp": b"old-a", "b.distcp": b"old-b"})
    assert committed_path(target) is None  # nothing committed yet: not a checkpoint
    publish_directory(staging, target)
    assert set(_files(target)) == {"a.distcp", "b.distcp", COMMIT_MARKER}
    assert committed_path(target) == target and not _memory().exists(_inner(staging))

    staging = prepare_staging(target)
    _write_dir(staging, {"c.distcp": b"new-c"})
    assert committed_path(target) == target  # an upload in progress leaves the previous checkpoint
    assert _files(target)["a.distcp"] == b"old-a"
    publish_directory(staging, target)
    assert set(_files(target)) == {"c.distcp", COMMIT_MARKER}  # no stale shard of the old one


def test_an_interrupted_publish_resolves_to_the_committed_staging_and_rolls_forward(root: str) -> None:
    target = f"{root}/last.ckpt"
    staging = prepare_staging(target)
    _write_dir(staging, {"old": b"1"})
    publish_directory(staging, target)
    # the state a writer killed in the middle of step 3 leaves: staging committed, target half-replaced
    staging = prepare_staging(target)
    _write_dir(staging, {"new": b"2", COMMIT_MARKER: b"{}"})
    fs = _memory()
    fs.rm_file(f"{_inner(target)}/{COMMIT_MARKER}")
    assert committed_path(target) == staging  # the new checkpoint is complete, in the staging prefix
    prepare_staging(target)  # the next save first finishes the interrupted publish
    assert _files(target) == {"new": b"2", COMMIT_MARKER: b"{}"}
    assert committed_path(target) == target


def test_stale_uncommitted_staging_is_ignored_by_last_and_cleaned(root: str) -> None:
    ckpts = f"{root}/ckpts"
    io = TorchCheckpointIO()
    io.save_checkpoint({"state_dict": {}}, f"{ckpts}/epoch=0-step=2.ckpt")
    _write_dir(f"{ckpts}/.last.ckpt.partial", {"__0_0.distcp": b"x"})  # a killed upload
    _write_dir(f"{ckpts}/epoch=1-step=4.ckpt", {"__0_0.distcp": b"x"})  # a directory never committed
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[ModelCheckpoint(ckpts)])
    assert find_last_checkpoint(trainer) == f"{ckpts}/epoch=0-step=2.ckpt"
    prepare_staging(f"{ckpts}/last.ckpt")
    assert _files(f"{ckpts}/.last.ckpt.partial") == {}


def test_torch_io_round_trip_and_clear_errors_on_a_store(root: str) -> None:
    io = TorchCheckpointIO()
    url = f"{root}/deep/er/one.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.arange(3.0)}}, url)
    assert torch.equal(io.load_checkpoint(url)["state_dict"]["w"], torch.arange(3.0))
    with pytest.raises(CheckpointError, match="does not exist"):
        io.load_checkpoint(f"{root}/missing.ckpt")
    _memory().pipe_file(f"{_inner(root)}/garbage.ckpt", b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"garbage\.ckpt.*not a valid checkpoint"):
        io.load_checkpoint(f"{root}/garbage.ckpt")
    io.remove_checkpoint(url)
    assert not _memory().exists(_inner(url))
    io.remove_checkpoint(url)  # missing is fine


# ---------------------------------------------------------------------- the Trainer on a store
def _fit(root: str, epochs: int, ckpt_path: str | None = None, **checkpoint: Any) -> tuple[Net, Trainer]:
    torch.manual_seed(0)
    model = Net(dropout=0.0)
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(save_last=True, **checkpoint)],
    )
    trainer.fit(model, loader(n=16), ckpt_path=ckpt_path)
    return model, trainer


def test_fit_to_a_store_then_resume_last_equals_plain_pytorch(root: str) -> None:
    _fit(root, 2)
    stored = _memory().find(_inner(root))
    assert any(path.endswith("version_0/checkpoints/last.ckpt") for path in stored), stored
    logs = ("version_0/metrics.csv", "version_0/events.out.tfevents")  # the default logger: CSV or TensorBoard
    assert any(log in path for path in stored for log in logs), stored  # the log is there too
    model, trainer = _fit(root, 4, ckpt_path="last")
    assert trainer.ckpt_path is not None and trainer.ckpt_path.endswith("version_0/checkpoints/last.ckpt")
    assert trainer.ckpt_path.startswith("memory://") and trainer.global_step == 16

    torch.manual_seed(0)
    reference = Net(dropout=0.0)
    plain_fit(reference, loader(n=16), epochs=4)
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=name)


def test_top_k_removal_and_last_on_a_store(root: str) -> None:
    _fit(root, 3, dirpath=f"{root}/ckpts", monitor="train_loss", save_top_k=1)
    names = sorted(path.rpartition("/")[2] for path in _memory().find(f"{_inner(root)}/ckpts"))
    assert len(names) == 2 and "last.ckpt" in names, names  # the best one and last; the others were removed


def test_csv_logger_writes_to_a_store(root: str) -> None:
    logger = CSVLogger(root, name="exp")
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.save()
    logger.log_metrics({"loss": 0.5, "acc": 0.9}, step=1)
    logger.save()
    assert logger.log_dir == f"{root}/exp/version_0"
    text = _files(logger.log_dir)["metrics.csv"].decode().splitlines()
    assert text[0].split(",") == ["step", "acc", "loss"] and len(text) == 3
    assert b"lr: 0.1" in _files(logger.log_dir)["hparams.yaml"]
    assert CSVLogger(root, name="exp").version == 1  # the next run gets the next version
