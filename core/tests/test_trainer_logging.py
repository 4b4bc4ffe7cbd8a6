"""Metric aggregation, callback_metrics, the CSV logger and the progress bar."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import Net, loader

from phalanx.callbacks import Callback
from phalanx.callbacks.progress import TQDMProgressBar
from phalanx.errors import MisconfigurationError
from phalanx.loggers import CSVLogger
from phalanx.trainer.trainer import Trainer


class Logging(Net):
    """Logs step/epoch values whose aggregates are easy to compute by hand."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("idx", float(batch_idx), on_step=True, on_epoch=True, prog_bar=True)
        self.log("idx_max", float(batch_idx), on_epoch=True, reduce_fx="max", on_step=False)
        self.log("idx_sum", float(batch_idx), on_epoch=True, reduce_fx=torch.sum, on_step=False)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_weighted", float(batch_idx))  # batches of 4 and 2 samples: weighted mean


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_aggregation_and_callback_metrics(tmp_path: Path) -> None:
    trainer = Trainer(
        max_epochs=2,
        log_every_n_steps=3,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_checkpointing=False,
        logger=CSVLogger(tmp_path),
    )
    trainer.fit(Logging(), loader(n=24, batch_size=4), loader(n=6, batch_size=4))
    metrics = trainer.callback_metrics
    assert metrics["idx_step"].item() == 5.0
    assert metrics["idx_epoch"].item() == pytest.approx(2.5)
    assert metrics["idx"].item() == pytest.approx(2.5)
    assert metrics["idx_max"].item() == 5.0
    assert metrics["idx_sum"].item() == 15.0
    assert metrics["val_weighted"].item() == pytest.approx((0 * 4 + 1 * 2) / 6)
    assert trainer.progress_bar_metrics["idx_epoch"] == pytest.approx(2.5)

    assert isinstance(trainer.logger, CSVLogger)
    path = Path(trainer.logger.log_dir) / "metrics.csv"
    assert path == tmp_path / "lightning_logs" / "version_0" / "metrics.csv"
    rows = _rows(path)
    assert list(rows[0])[:2] == ["epoch", "step"]
    step_rows = [r for r in rows if r["idx_step"]]
    assert [int(r["step"]) for r in step_rows] == [2, 5, 8, 11]
    assert [float(r["idx_step"]) for r in step_rows] == [2.0, 5.0, 2.0, 5.0]
    epoch_rows = [r for r in rows if r["idx_epoch"]]
    assert [(float(r["epoch"]), int(r["step"])) for r in epoch_rows] == [(0.0, 5), (1.0, 11)]
    assert [float(r["idx_sum"]) for r in epoch_rows] == [15.0, 15.0]
    val_rows = [r for r in rows if r["val_weighted"]]
    assert len(val_rows) == 2


def test_second_run_gets_next_version(tmp_path: Path) -> None:
    for expected in ("version_0", "version_1"):
        trainer = Trainer(max_steps=1, default_root_dir=tmp_path, enable_progress_bar=False, enable_checkpointing=False)
        trainer.fit(Net(), loader())
        assert Path(trainer.log_dir).name == expected


def test_default_logger_is_tensorboard_when_installed_else_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from phalanx.loggers import TensorBoardLogger

    trainer = Trainer(default_root_dir=tmp_path)
    installed = importlib.util.find_spec("tensorboard") is not None
    assert isinstance(trainer.logger, TensorBoardLogger if installed else CSVLogger)
    assert trainer.log_dir == str(tmp_path / "lightning_logs" / "version_0")

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real_find_spec(name, *a)
    )
    assert isinstance(Trainer(default_root_dir=tmp_path).logger, CSVLogger)


def test_a_duck_typed_logger_is_accepted_and_called_after_setup(tmp_path: Path) -> None:
    from unittest.mock import Mock

    class NothingYet(Callback):
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            assert not trainer.logger.method_calls  # the loggers' first call comes after the setup hooks

    logger = Mock(save_dir=str(tmp_path), version="0")
    logger.name = "duck"
    trainer = Trainer(max_steps=2, default_root_dir=tmp_path, logger=logger, log_every_n_steps=1,
                      callbacks=[NothingYet()], enable_progress_bar=False, enable_checkpointing=False)  # fmt: skip
    assert trainer.log_dir == str(tmp_path)  # no log_dir path: its save_dir, as in Lightning
    trainer.fit(Net(), loader())
    assert logger.log_metrics.call_count == 2 and logger.finalize.call_args.args == ("success",)
    with pytest.raises(MisconfigurationError, match="logger=5"):
        Trainer(logger=5)


def test_csv_logger_widens_header(tmp_path: Path) -> None:
    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=1)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.log_metrics({"a": 2.0, "b": 3.0}, step=1)
    logger.finalize("success")
    rows = _rows(Path(logger.metrics_file_path))
    assert rows == [{"step": "0", "a": "1.0", "b": ""}, {"step": "1", "a": "2.0", "b": "3.0"}]


def test_progress_bar_draws_on_rank_zero_only(capsys: pytest.CaptureFixture[str]) -> None:
    bar = TQDMProgressBar()
    Trainer(max_epochs=1, callbacks=[bar], logger=False, enable_checkpointing=False).fit(Logging(), loader(n=8))
    assert "Epoch 0" in capsys.readouterr().out  # tqdm draws on stdout, as in Lightning

    class NotRankZero(TQDMProgressBar):
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            super().setup(trainer, pl_module, stage)
            self.disable()  # what setup does when trainer.is_global_zero is False

    Trainer(max_epochs=1, callbacks=[NotRankZero()], logger=False, enable_checkpointing=False).fit(
        Logging(), loader(n=8)
    )
    assert "Epoch 0" not in capsys.readouterr().out
    Trainer(max_epochs=1, enable_progress_bar=False, logger=False, enable_checkpointing=False).fit(
        Logging(), loader(n=8)
    )
    assert "Epoch" not in capsys.readouterr().out


def test_epoch_end_hooks_read_this_epochs_aggregates_from_callback_metrics() -> None:
    """As in Lightning, a callback's on_train_epoch_end / on_validation_epoch_end finds the epoch's
    values (``train_loss`` = ``train_loss_epoch``, ``val_loss``) in callback_metrics."""
    from phalanx.callbacks import Callback

    seen: dict[str, dict[str, float]] = {}

    class Reader(Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            seen["train"] = {k: float(v) for k, v in trainer.callback_metrics.items()}

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            seen["val"] = {k: float(v) for k, v in trainer.callback_metrics.items()}

    class EpochNet(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            self.log("train_loss", loss, on_epoch=True)
            self.losses.append(float(loss.detach()))
            return loss

    model = EpochNet(dropout=0.0)
    model.losses = []
    trainer = Trainer(
        max_epochs=1, num_sanity_val_steps=0, callbacks=[Reader()], enable_progress_bar=False, logger=False,
        enable_checkpointing=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, loader(n=16), loader(n=8))
    mean = sum(model.losses) / len(model.losses)  # equal batch sizes: the epoch mean is the plain mean
    assert seen["train"]["train_loss_epoch"] == pytest.approx(mean, rel=1e-6)
    assert seen["train"]["train_loss"] == seen["train"]["train_loss_epoch"]
    assert seen["val"]["val_loss"] == pytest.approx(float(trainer.callback_metrics["val_loss"]))


def test_a_name_logged_from_two_hooks_is_two_metrics_and_the_later_one_publishes_last() -> None:
    """As in Lightning, results are kept per hook: different options in different hooks are fine."""

    class Shared(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("shared", 100.0, on_step=True, on_epoch=False)
            return super().training_step(batch, batch_idx)

        def on_train_epoch_end(self) -> None:
            self.log("shared", 111.0)  # on_epoch=True here by default

    trainer = Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Shared(), loader())
    assert float(trainer.callback_metrics["shared"]) == 111.0


def test_loggers_get_what_on_train_start_logs_and_are_called_on_every_rank_by_design() -> None:
    """As Lightning: on_train_start's values belong to the first epoch; the Trainer calls loggers on
    every rank (a single process here), the built-in loggers guard themselves with rank_zero_only."""
    from phalanx.loggers import Logger

    class Recorder(Logger):
        def __init__(self) -> None:
            super().__init__()
            self.logged: dict[str, float] = {}

        @property
        def name(self) -> str:
            return "recorder"

        @property
        def version(self) -> int:
            return 0

        def log_metrics(self, metrics: Any, step: int | None = None) -> None:
            self.logged.update(metrics)

    class AtStart(Net):
        def on_train_start(self) -> None:
            self.log("at_start", 3.0)

    recorder = Recorder()
    trainer = Trainer(max_epochs=1, logger=recorder, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(AtStart(), loader())
    assert recorder.logged["at_start"] == 3.0
