"""WandbLogger on a real offline fit, read back from the run's ``.wandb`` file with wandb's own protobufs.

wandb 0.2x+ ships no Python reader for its transaction log any more, so :func:`_records` splits the
file into records (the LevelDB log framing wandb writes: a ``:W&B`` header, then 32 KiB blocks of
``crc32 | length | type | payload`` chunks) and parses each with ``wandb.proto.wandb_internal_pb2.Record``.
Starting W&B's service takes a second or two, so the whole module shares one run (a module
fixture), which it finishes and tears down before any test runs: no service process or
``WANDB_*`` variable outlives it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from logger_helpers import Recorder, data, plain_losses, trainer_kwargs
from torch.utils.data import DataLoader

from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.errors import MisconfigurationError
from phalanx.loggers._backends import MissingBackendError
from phalanx.loggers.wandb import WandbLogger
from phalanx.trainer.trainer import Trainer

_BLOCK = 32 * 1024
_HEADER = 7  # b":W&B" + 2-byte magic + 1-byte version; each chunk header is also 7 bytes


def _records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B", raw[:_HEADER]
    position, pending = _HEADER, b""
    while position + _HEADER <= len(raw):
        left = _BLOCK - position % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            position += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", raw[position : position + _HEADER])
        if kind == 0 and length == 0:
            position += left
            continue
        chunk = raw[position + _HEADER : position + _HEADER + length]
        position += _HEADER + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # full, or last chunk of a record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _items(items: Any) -> dict[str, Any]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


class OfflineRun:
    """What one offline fit wrote, parsed."""

    def __init__(self, path: Path) -> None:
        self.history: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}
        self.artifacts: list[Any] = []
        self.run: Any = None
        for record in _records(path):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                self.history.append(_items(record.history.item))
            elif kind == "config":
                self.config.update(_items(record.config.update))
            elif kind == "summary":
                self.summary.update(_items(record.summary.update))
            elif kind == "artifact":
                self.artifacts.append(record.artifact)
            elif kind == "run":
                self.run = record.run
                self.config.update(_items(record.run.config.update))

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(row["trainer/global_step"], row[key]) for row in self.history if key in row]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import wandb

    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": root}.items():
            patch.setenv(name, str(value))
        for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            patch.setenv(name, str(root / name.lower()))
        torch.manual_seed(0)
        model = Recorder(lr=0.1, hidden=4)
        initial = {key: value.clone() for key, value in model.state_dict().items()}
        logger = WandbLogger(
            name="tiny", save_dir=root / "runs", project="proj", offline=True, settings=wandb.Settings(console="off")
        )
        checkpoint = ModelCheckpoint(monitor="val_loss")
        trainer = Trainer(
            default_root_dir=root, logger=logger, callbacks=[checkpoint], **trainer_kwargs(enable_checkpointing=True)
        )
        train = DataLoader(data(16), batch_size=4)
        try:
            trainer.fit(model, train, DataLoader(data(4, seed=1), batch_size=4))
            run_dir = Path(logger.experiment.dir).parent
            log_dir = trainer.log_dir
            # offline refuses log_model; a second logger on the same run uploads into the offline file
            uploader = WandbLogger(experiment=logger.experiment, log_model="all", checkpoint_name="ckpt")
            uploader.after_save_checkpoint(checkpoint)  # what ModelCheckpoint reports after a save
            logger.experiment.finish()
        finally:
            wandb.teardown()  # stops the service process and drops WANDB_SERVICE
    return {
        "model": model,
        "plain": plain_losses(model, initial, train, epochs=2),
        "logger": logger,
        "root": root,
        "run_dir": run_dir,
        "log_dir": log_dir,
        "checkpoint": checkpoint,
        "run": OfflineRun(next(run_dir.glob("run-*.wandb"))),
    }


def test_offline_fit_writes_history_against_the_trainer_step(fitted: dict[str, Any]) -> None:
    model, run = fitted["model"], fitted["run"]
    assert run.series("train_loss") == model.train_log
    assert [loss for _, loss in model.train_log] == fitted["plain"]
    assert run.series("val_loss") == [(3, model.val_log[0]), (7, model.val_log[1])]
    assert run.summary["train_loss"] == model.train_log[-1][1]
    assert run.summary["val_loss"] == model.val_log[-1]


def test_offline_fit_writes_config_and_run_identity(fitted: dict[str, Any]) -> None:
    logger, run, run_dir = fitted["logger"], fitted["run"], fitted["run_dir"]
    assert {key: run.config[key] for key in ("lr", "hidden", "sync_dist")} == {
        "lr": 0.1,
        "hidden": 4,
        "sync_dist": False,
    }
    assert (run.run.run_id, run.run.project, run.run.display_name) == (logger.version, "proj", "tiny")
    assert run_dir.parent == fitted["root"] / "runs" / "wandb" and run_dir.name.startswith("offline-run-")
    assert run_dir.name.endswith(logger.version)
    assert logger.name == "proj"
    assert fitted["log_dir"] == str(fitted["root"] / "runs" / "proj" / logger.version)


def test_log_model_uploads_the_best_checkpoint_as_an_artifact(fitted: dict[str, Any]) -> None:
    checkpoint, run = fitted["checkpoint"], fitted["run"]
    best = Path(checkpoint.best_model_path)
    assert best.parent == Path(fitted["log_dir"]) / "checkpoints"  # beside the run, as Lightning puts it
    (artifact,) = run.artifacts
    assert (artifact.name, artifact.type, sorted(artifact.aliases)) == ("ckpt", "model", ["best", "latest"])
    metadata = json.loads(artifact.metadata)
    assert metadata["score"] == float(checkpoint.best_model_score) and metadata["original_filename"] == best.name
    assert metadata["ModelCheckpoint"]["monitor"] == checkpoint.monitor
    (entry,) = artifact.manifest.contents
    digest = base64.b64encode(hashlib.md5(best.read_bytes()).digest()).decode()
    assert (entry.path, entry.size, entry.digest) == ("model.ckpt", best.stat().st_size, digest)


def test_identity_without_starting_a_run() -> None:
    logger = WandbLogger(id="abc123", project="p")
    assert (logger.version, logger.name, logger.save_dir) == ("abc123", "p", ".")
    assert logger.log_dir == os.path.join(".", "p", "abc123")
    assert WandbLogger(version="v9", save_dir=None, dir="elsewhere").save_dir == "elsewhere"


def test_offline_with_log_model_is_refused() -> None:
    with pytest.raises(MisconfigurationError, match="offline=True.*Fix: pass offline=False"):
        WandbLogger(offline=True, log_model=True)


def test_missing_wandb_is_one_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingBackendError, match=r"pip install 'phalanx-core\[wandb\]'"):
        WandbLogger()
