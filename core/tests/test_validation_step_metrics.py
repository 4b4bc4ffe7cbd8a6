"""``self.log(..., on_step=True)`` in validation_step reaches the loggers per batch, as in Lightning."""

from __future__ import annotations

import copy
import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.loggers.csv_logs import CSVLogger

VAL_BATCHES = 3


def _loader(n: int, seed: int) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(
        TensorDataset(torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator)), batch_size=4
    )


class StepLogging(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.snapshots: list[nn.Linear] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def on_validation_start(self) -> None:
        if not self.trainer.sanity_checking:
            self.snapshots.append(copy.deepcopy(self.layer))

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("val_loss", loss, on_step=True)  # on_epoch defaults to True in validation
        self.log("val_err", (self.layer(x) - y).abs().max(), on_step=True, on_epoch=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _rows(logger: CSVLogger) -> list[dict[str, str]]:
    with open(logger.metrics_file_path, newline="") as stream:  # type: ignore[attr-defined]
        return list(csv.DictReader(stream))


def _series(rows: list[dict[str, str]], key: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in rows if r.get(key)]


def _reference(layer: nn.Linear, loader: DataLoader) -> tuple[list[float], list[float]]:
    losses, errors = [], []
    with torch.no_grad():
        for i, (x, y) in enumerate(loader):
            if i >= VAL_BATCHES:
                break
            losses.append(nn.functional.mse_loss(layer(x), y).item())
            errors.append((layer(x) - y).abs().max().item())
    return losses, errors


def test_validation_step_metrics_reach_the_csv_per_batch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = StepLogging()
    logger = CSVLogger(str(tmp_path), name="run", flush_logs_every_n_steps=1)
    trainer = Trainer(
        accelerator="cpu", max_epochs=2, limit_val_batches=VAL_BATCHES, num_sanity_val_steps=2, logger=logger,
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1,
    )  # fmt: skip
    val = _loader(20, seed=1)
    trainer.fit(model, _loader(16, seed=0), val)
    rows = _rows(logger)
    expected_losses, expected_errors = [], []
    for layer in model.snapshots:  # one snapshot per validation run (the sanity check is not logged)
        losses, errors = _reference(layer, val)
        expected_losses += losses
        expected_errors += errors
    assert len(model.snapshots) == 2
    # Lightning: the step is the count of evaluated batches of this dataloader, continuing across the fit's validations
    steps = list(range(2 * VAL_BATCHES))
    logged = _series(rows, "val_loss_step")
    assert [s for s, _ in logged] == steps
    assert [v for _, v in logged] == pytest.approx(expected_losses, rel=1e-6)
    logged_err = _series(rows, "val_err")
    assert [s for s, _ in logged_err] == steps
    assert [v for _, v in logged_err] == pytest.approx(expected_errors, rel=1e-6)
    # step rows carry no epoch column value (Lightning passes the step explicitly and adds no epoch)
    assert all(not r.get("epoch") for r in rows if r.get("val_loss_step"))
    # the epoch aggregate still arrives under the _epoch suffix, once per validation
    epoch_values = [v for _, v in _series(rows, "val_loss_epoch")]
    assert epoch_values == pytest.approx(
        [sum(expected_losses[:VAL_BATCHES]) / VAL_BATCHES, sum(expected_losses[VAL_BATCHES:]) / VAL_BATCHES], rel=1e-6
    )
    assert trainer.logged_metrics["val_loss_step"] == pytest.approx(expected_losses[-1], rel=1e-6)


def test_validate_restarts_the_count_per_call_and_dataloader(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = StepLogging()
    logger = CSVLogger(str(tmp_path), name="run", flush_logs_every_n_steps=1)
    trainer = Trainer(
        accelerator="cpu", limit_val_batches=2, logger=logger, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.validate(model, [_loader(12, seed=1), _loader(12, seed=2)], verbose=False)
    trainer.validate(model, _loader(12, seed=1), verbose=False)
    rows = _rows(logger)
    assert [s for s, _ in _series(rows, "val_loss_step/dataloader_idx_0")] == [0, 1]
    assert [s for s, _ in _series(rows, "val_loss_step/dataloader_idx_1")] == [0, 1]
    assert [s for s, _ in _series(rows, "val_loss_step")] == [0, 1]  # the second call starts again at 0
