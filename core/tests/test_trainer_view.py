"""TrainerView is what callbacks see: the Trainer satisfies it, the built-in callbacks use nothing
else, and a checkpoint callback written from its public names alone works like ModelCheckpoint."""

from __future__ import annotations

import ast
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import phalanx.callbacks
from phalanx.callbacks.callback import Callback
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer
from phalanx.trainer_view import TrainerView

CALLBACKS_DIR = Path(phalanx.callbacks.__file__).parent


def _members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_trainer_satisfies_the_view(tmp_path: Path) -> None:
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, logger=False, enable_progress_bar=False)
    assert isinstance(trainer, TrainerView)
    missing = [name for name in sorted(_members(TrainerView)) if not hasattr(trainer, name)]
    assert missing == []
    trainer.should_stop = True  # the one setter
    assert trainer.should_stop is True
    with pytest.raises(AttributeError):
        trainer.global_step = 3  # type: ignore[misc]  # read-only


def _trainer_attributes(path: Path) -> set[str]:
    """Every ``trainer.<name>`` a callback module reads (the parameter is named ``trainer``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
            names.add(node.attr)
    return names


@pytest.mark.parametrize("path", sorted(CALLBACKS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_built_in_callbacks_use_only_the_view(path: Path) -> None:
    used = _trainer_attributes(path)
    assert used - _members(TrainerView) == set(), f"{path.name} reads Trainer names outside TrainerView"


def test_the_check_above_catches_a_name_outside_the_view(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def on_fit_start(self, trainer, pl_module):\n    trainer.fit_loop.epoch\n    trainer.global_step\n")
    assert _trainer_attributes(sample) - _members(TrainerView) == {"fit_loop"}


class PublicCheckpoint(Callback):
    """A minimal ModelCheckpoint, written as a vendor would: TrainerView members only.

    Keeps the best checkpoint by ``monitor`` (min) and ``last.ckpt``, saving after validation;
    ranks agree on the metric through the strategy's broadcast, as ModelCheckpoint does.
    """

    monitors_metrics = True

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor
        self.dirpath = ""
        self.best_path = ""
        self.best_score = math.inf
        self.saved: list[str] = []

    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        self.dirpath = trainer.strategy.broadcast(trainer.default_checkpoint_dir)

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        assert trainer.validation_enabled and trainer.validation_has_run
        value = trainer.callback_metrics[self.monitor]
        score = float(trainer.strategy.broadcast(float(value)))
        path = os.path.join(self.dirpath, f"epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt")
        if score < self.best_score:
            previous, self.best_path, self.best_score = self.best_path, path, score
            trainer.save_checkpoint(path)
            self.saved.append(path)
            if previous:
                trainer.strategy.remove_checkpoint(previous)
        trainer.save_checkpoint(os.path.join(self.dirpath, "last.ckpt"))


class _Regressor(Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def test_a_checkpoint_callback_from_public_names_alone_runs(tmp_path: Path) -> None:
    callback = PublicCheckpoint("val_loss")
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=3,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[callback],
    )
    trainer.fit(_Regressor(), _data(), _data())
    assert callback.dirpath == os.path.join(str(tmp_path), "checkpoints")
    # the loss falls every epoch, so each epoch is the new best and the previous best is removed
    assert len(callback.saved) == 3
    assert sorted(p.name for p in Path(callback.dirpath).iterdir()) == ["epoch=2-step=12.ckpt", "last.ckpt"]
    assert callback.best_score == pytest.approx(float(trainer.callback_metrics["val_loss"]))
    # what it wrote resumes like a ModelCheckpoint file
    resumed = Trainer(
        accelerator="cpu", max_epochs=4, default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
        enable_checkpointing=False,
    )  # fmt: skip
    resumed.fit(_Regressor(), _data(), ckpt_path=callback.best_path)
    assert resumed.global_step == 16 and resumed.current_epoch == 4


def test_estimated_stepping_batches(tmp_path: Path) -> None:
    quiet = {"accelerator": "cpu", "default_root_dir": tmp_path, "logger": False, "enable_progress_bar": False}
    seen: list[float] = []

    class _Reads(_Regressor):
        def configure_optimizers(self) -> torch.optim.Optimizer:
            seen.append(self.trainer.estimated_stepping_batches)
            return super().configure_optimizers()

    Trainer(max_epochs=3, accumulate_grad_batches=3, **quiet).fit(_Reads(), _data())  # 4 batches: 2 steps/epoch
    Trainer(max_steps=5, **quiet).fit(_Reads(), _data())
    Trainer(max_epochs=2, max_steps=100, **quiet).fit(_Reads(), _data())
    assert seen == [6.0, 5.0, 8.0]
