"""A third-party distribution's callback and logger (phalanx-testplugin, pip-installed by the
integration session) are found through the ``phalanx`` entry-point group and used by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.registry import CallbackRegistry, LoggerRegistry


class Regression(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_plugin_callback_and_logger_are_listed_with_their_distribution() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "plugins", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    plugin = next(p for p in json.loads(out) if p["entry_point"] == "testplugin")
    assert plugin["provides"]["callback"] == ["step_journal"]
    assert plugin["provides"]["logger"] == ["jsonl"]
    assert CallbackRegistry.entry("step_journal").source.distribution == "phalanx-testplugin"
    assert LoggerRegistry.entry("jsonl").source.distribution == "phalanx-testplugin"


def test_trainer_uses_the_plugin_callback_and_logger_by_name(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(12, 3, generator=generator), torch.randn(12, 1, generator=generator))
    model = Regression()
    trainer = Trainer(
        max_epochs=2,
        callbacks=["step_journal"],
        logger="jsonl",
        log_every_n_steps=1,
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_checkpointing=False,
    )
    assert type(trainer.logger).__module__ == "phalanx_testplugin.observers"
    trainer.fit(model, DataLoader(data, batch_size=4))

    journal = [json.loads(line) for line in (tmp_path / "journal-0.jsonl").read_text().splitlines()]
    assert [(row["step"], row["epoch"]) for row in journal] == [(s, (s - 1) // 3) for s in range(1, 7)]
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_rows = [row for row in logged if "train_loss" in row]
    assert [row["train_loss"] for row in train_rows] == [float(torch.tensor(v)) for v in model.losses]
