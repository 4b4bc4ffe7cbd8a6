"""Callbacks and loggers by name: the built-in ones are registered through the core's own plugin,
exactly as a vendor's would be, and the Trainer builds them from ``callbacks=[...]`` / ``logger=``."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import Net, loader

from phalanx.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from phalanx.errors import UnknownNameError
from phalanx.loggers import CSVLogger
from phalanx.registry import CallbackRegistry, LoggerRegistry
from phalanx.trainer.trainer import Trainer


def test_builtin_callbacks_and_loggers_are_registered_by_the_core_plugin() -> None:
    assert {"model_checkpoint", "early_stopping", "learning_rate_monitor", "timer"} <= set(CallbackRegistry.names())
    assert {"csv", "tensorboard", "mlflow", "wandb"} <= set(LoggerRegistry.names())
    assert CallbackRegistry.entry("early_stopping").source.plugin == "builtin"
    assert LoggerRegistry.entry("csv").source.plugin == "builtin"
    plugins = json.loads(
        subprocess.run(
            [sys.executable, "-m", "phalanx.cli", "plugins", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    builtin = next(p for p in plugins if p["entry_point"] == "builtin")
    assert "early_stopping" in builtin["provides"]["callback"]
    assert builtin["provides"]["logger"][:2] == ["csv", "tensorboard"]


def test_trainer_builds_named_callbacks_and_loggers(tmp_path: Path) -> None:
    trainer = Trainer(
        max_epochs=2,
        callbacks=["early_stopping", "learning_rate_monitor", ModelCheckpoint(monitor="val_loss")],
        logger="csv",
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
    )
    stopper = next(cb for cb in trainer.callbacks if isinstance(cb, EarlyStopping))
    assert stopper.monitor == "val_loss"  # the registered default
    assert any(isinstance(cb, LearningRateMonitor) for cb in trainer.callbacks)
    assert isinstance(trainer.logger, CSVLogger)
    assert Path(trainer.logger.save_dir) == tmp_path  # a named logger writes where logger=True would
    trainer.fit(Net(), loader(), loader(n=8))
    with open(Path(trainer.logger.log_dir) / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    lrs = [float(r["lr-SGD"]) for r in rows if r.get("lr-SGD")]
    assert lrs and all(lr == pytest.approx(0.05) for lr in lrs)
    val_losses = [float(r["val_loss"]) for r in rows if r.get("val_loss")]
    assert len(val_losses) == 2
    assert float(stopper.best_score) == pytest.approx(min(val_losses))


def test_unknown_names_raise_with_the_closest_match_and_the_choices() -> None:
    with pytest.raises(
        UnknownNameError, match=r"Unknown callback 'early_stoping'.*Did you mean 'early_stopping'.*Available"
    ):
        Trainer(callbacks=["early_stoping"])
    with pytest.raises(UnknownNameError, match=r"Unknown logger 'tensorbord'.*Did you mean 'tensorboard'"):
        Trainer(logger="tensorbord")


def test_a_name_of_the_wrong_kind_is_refused_naming_the_registered_choices() -> None:
    with pytest.raises(Exception, match="callbacks") as err:
        Trainer(callbacks=[42])
    assert "early_stopping" in str(err.value)


def test_runtime_registration_from_user_code(tmp_path: Path) -> None:
    CallbackRegistry.register("my_checkpoint", ModelCheckpoint, "user-registered", save_top_k=-1)
    try:
        trainer = Trainer(callbacks=["my_checkpoint"], logger=False, default_root_dir=str(tmp_path), max_epochs=1)
        (checkpoint,) = [cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)]
        assert checkpoint.save_top_k == -1
    finally:
        CallbackRegistry.remove("my_checkpoint")


def test_every_builtin_name_builds_its_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx.callbacks import Callback
    from phalanx.loggers import Logger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x keeps its file store behind this switch
    for name in CallbackRegistry.names():
        if CallbackRegistry.entry(name).source.plugin == "builtin":
            assert isinstance(CallbackRegistry.get(name), Callback), name
    for name in LoggerRegistry.names():
        if LoggerRegistry.entry(name).source.plugin == "builtin":
            logger = LoggerRegistry.get(name, save_dir=str(tmp_path))
            assert isinstance(logger, Logger), name
            assert type(logger).__name__.lower().startswith(name[:3]), (name, type(logger))
