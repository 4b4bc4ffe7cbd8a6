"""Tuner.lr_find and the LearningRateFinder callback, against a plain-PyTorch range test."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.callbacks.lr_finder import LearningRateFinder, _LRFinder, lr_at
from phalanx.errors import MisconfigurationError
from phalanx.tuner import Tuner

N_STEPS = 12
MIN_LR, MAX_LR = 1e-4, 0.5


def _data(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


class Regression(Module):
    def __init__(self, lr: float = 0.01, attr: str = "lr") -> None:
        super().__init__()
        setattr(self, attr, lr)
        self._attr = attr
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=getattr(self, self._attr), momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_data(), batch_size=8)


def _reference(model: Regression, steps: int, mode: str = "exponential") -> tuple[list[float], list[float]]:
    """The range test in plain PyTorch: same schedule, same data order, Lightning's smoothing."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=MIN_LR, momentum=0.9)
    batches = [b for _ in range(10) for b in DataLoader(_data(), batch_size=8)]
    lrs, losses, avg = [], [], 0.0
    for step in range(steps):
        lr = lr_at(step, mode=mode, min_lr=MIN_LR, max_lr=MAX_LR, num_training=steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = batches[step]
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model.layer(x), y)
        loss.backward()
        optimizer.step()
        avg = 0.98 * avg + 0.02 * loss.item()
        lrs.append(lr)
        losses.append(avg / (1 - 0.98 ** (step + 2)))
    return lrs, losses


def _trainer(tmp_path: Path, **kwargs: object) -> Trainer:
    return Trainer(
        accelerator="cpu", devices=1, default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
        enable_model_summary=False, **kwargs,
    )  # fmt: skip


def test_lr_find_records_the_reference_curve_and_restores_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Regression()
    before = copy.deepcopy(model.state_dict())
    ref_lrs, ref_losses = _reference(model, N_STEPS)
    trainer = _trainer(tmp_path, max_epochs=3)
    finder = Tuner(trainer).lr_find(
        model, min_lr=MIN_LR, max_lr=MAX_LR, num_training=N_STEPS, early_stop_threshold=None, update_attr=False
    )
    assert finder is not None
    assert finder.results["lr"] == pytest.approx(ref_lrs, rel=1e-12)
    assert finder.results["loss"] == pytest.approx(ref_losses, rel=1e-6)
    # lr schedule is Lightning's: min_lr first, max_lr last, exponential in between
    assert finder.results["lr"][0] == MIN_LR
    assert finder.results["lr"][-1] == pytest.approx(MAX_LR)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    assert model.lr == 0.01  # update_attr=False
    assert trainer.global_step == 0  # the user's Trainer is untouched
    trainer.fit(model)  # the real fit still runs from scratch afterwards
    assert trainer.global_step > 0


@pytest.mark.parametrize("attr", ["lr", "learning_rate"])
def test_update_attr_writes_the_suggestion(tmp_path: Path, attr: str) -> None:
    torch.manual_seed(0)
    model = Regression(attr=attr)
    finder = Tuner(_trainer(tmp_path, max_epochs=5)).lr_find(model, min_lr=MIN_LR, max_lr=MAX_LR, num_training=30)
    assert finder is not None
    suggestion = finder.suggestion()
    assert suggestion is not None
    assert getattr(model, attr) == suggestion


def test_suggestion_is_lightnings_steepest_gradient() -> None:
    finder = _LRFinder("exponential", 1e-5, 1.0, 40)
    lrs = [1e-5 * (1e5) ** (i / 39) for i in range(40)]
    losses = [2.0 - math.tanh((math.log10(lr) + 2.5) * 2) + (0.5 if i > 36 else 0.0) for i, lr in enumerate(lrs)]
    finder.results = {"lr": lrs, "loss": losses}
    # Lightning's rule: skip 10 first / 1 last point, torch.gradient w.r.t. lr, argmin
    kept_l, kept_lr = torch.tensor(losses[10:-1], dtype=torch.float64), torch.tensor(lrs[10:-1], dtype=torch.float64)
    expected = lrs[10 + int(torch.argmin(torch.gradient(kept_l, spacing=[kept_lr])[0]))]
    assert finder.suggestion() == expected
    finder.results = {"lr": lrs[:5], "loss": losses[:5]}
    assert finder.suggestion() is None


def test_early_stop_on_divergence(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Regression()
    finder = Tuner(_trainer(tmp_path, max_epochs=10)).lr_find(
        model, min_lr=1e-3, max_lr=1e4, num_training=60, update_attr=False
    )
    assert finder is not None
    assert len(finder.results["loss"]) < 60
    assert finder.results["loss"][-1] > 4.0 * min(finder.results["loss"])


def test_callback_in_fit_restores_state_and_trains_with_suggestion(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Regression()
    before = copy.deepcopy(model.state_dict())
    seen: dict[str, object] = {}

    class Probe(LearningRateFinder):
        def on_fit_start(self, trainer, pl_module):  # type: ignore[no-untyped-def]
            super().on_fit_start(trainer, pl_module)
            seen["weights"] = copy.deepcopy(pl_module.state_dict())
            seen["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
            seen["state"] = dict(trainer.optimizers[0].state)
            seen["step"] = trainer.global_step

    finder = Probe(min_lr=MIN_LR, max_lr=MAX_LR, num_training_steps=20)
    trainer = _trainer(tmp_path, max_steps=2, callbacks=[finder])
    trainer.fit(model)
    assert finder.optimal_lr is not None
    suggestion = finder.optimal_lr.suggestion()
    assert seen["lr"] == suggestion == model.lr
    assert seen["state"] == {}  # momentum buffers from the sweep are gone
    assert seen["step"] == 0
    for key, value in seen["weights"].items():  # type: ignore[attr-defined]
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_plot_writes_png(tmp_path: Path) -> None:
    torch.manual_seed(0)
    finder = Tuner(_trainer(tmp_path, max_epochs=5)).lr_find(
        Regression(), min_lr=MIN_LR, max_lr=MAX_LR, num_training=30
    )
    assert finder is not None
    figure = finder.plot(suggest=True, show=False)
    path = tmp_path / "lr.png"
    figure.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axis = figure.axes[0]
    assert axis.get_xscale() == "log"
    assert len(axis.lines) == 2  # the curve and the red suggestion marker


def test_bad_arguments_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(MisconfigurationError, match="mode='exponential'"):
        LearningRateFinder(mode="cubic")
    with pytest.raises(MisconfigurationError, match="only method='fit'"):
        Tuner(_trainer(tmp_path)).lr_find(Regression(), method="validate")

    class NoLr(Regression):
        def __init__(self) -> None:
            super().__init__(attr="rate")

    with pytest.raises(MisconfigurationError, match="attr_name"):
        Tuner(_trainer(tmp_path, max_epochs=1)).lr_find(NoLr(), num_training=3)
