"""StochasticWeightAveraging on real fits, against torch.optim.swa_utils (AveragedModel, SWALR, update_bn) by hand."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import SWALR, AveragedModel, get_swa_avg_fn, update_bn
from trainer_helpers import loader, quiet

from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.callbacks.stochastic_weight_avg import StochasticWeightAveraging
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.strategies import SingleDeviceStrategy
from phalanx.trainer.trainer import Trainer

EPOCHS = 5


class Small(Module):
    def __init__(self, *, batch_norm: bool = False, scheduler: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        middle = nn.BatchNorm1d(4) if batch_norm else nn.Tanh()
        self.net = nn.Sequential(nn.Linear(6, 4), middle, nn.Linear(4, 1))
        self.scheduler = scheduler
        self.lrs: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_epoch_start(self) -> None:
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)  # muted during the BatchNorm pass, which is not a training step
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)
        if not self.scheduler:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)}


def plain_swa(
    model: Small, swa_start: int, swa_lr: float, annealing: int, strategy: str
) -> tuple[AveragedModel, list[float]]:
    """What the callback must do, written with torch's swa_utils: average at each SWA epoch's start,
    SWALR from the SWA start (replacing StepLR), averaged weights (and update_bn) at the end."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scheduler: Any = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5) if model.scheduler else None
    averaged = AveragedModel(model, avg_fn=get_swa_avg_fn())
    lrs = []
    for epoch in range(EPOCHS):
        if epoch == swa_start:
            for group in optimizer.param_groups:
                group["initial_lr"] = swa_lr
            last = EPOCHS if strategy == "cos" else -1
            anneal: Any = strategy  # torch types it as a Literal
            scheduler = SWALR(
                optimizer, swa_lr=swa_lr, anneal_epochs=annealing, anneal_strategy=anneal, last_epoch=last
            )
        if epoch >= swa_start:
            averaged.update_parameters(model)
        lrs.append(optimizer.param_groups[0]["lr"])
        model.train()
        for x, y in loader(n=16):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
    if any(isinstance(m, nn.BatchNorm1d) for m in model.modules()):
        update_bn(loader(n=16), averaged)
    return averaged, lrs


def _same(got: nn.Module, want: nn.Module) -> None:
    for (name, x), (_, y) in zip(got.state_dict().items(), want.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    ("strategy", "scheduler", "batch_norm"), [("cos", False, False), ("linear", True, False), ("cos", False, True)]
)
def test_swa_equals_swa_utils_by_hand(strategy: str, scheduler: bool, batch_norm: bool) -> None:
    model = Small(batch_norm=batch_norm, scheduler=scheduler)
    reference = copy.deepcopy(model)
    averaged, lrs = plain_swa(reference, swa_start=2, swa_lr=0.05, annealing=2, strategy=strategy)
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=3, annealing_epochs=2, annealing_strategy=strategy)
    trainer = Trainer(max_epochs=EPOCHS, callbacks=[swa], **quiet())
    trainer.fit(model, loader(n=16))
    assert model.lrs == pytest.approx(lrs, rel=0, abs=0)
    assert int(swa.n_averaged) == EPOCHS - 2  # type: ignore[arg-type]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    _same(model.net, averaged.module.net)  # parameters and, after the BatchNorm pass, its statistics
    if batch_norm:  # the pass replaced the statistics the training weights left behind
        assert not torch.equal(model.net[1].running_mean, reference.net[1].running_mean)
    assert trainer.current_epoch == EPOCHS and trainer.global_step == 4 * EPOCHS  # no extra epoch counted


def test_fraction_start_and_early_stop_keeps_trained_weights() -> None:
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=0.6)
    model = Small()
    Trainer(max_epochs=EPOCHS, max_steps=12, callbacks=[swa], **quiet()).fit(model, loader(n=16))
    assert swa.swa_start == 2 and int(swa.n_averaged) == 1  # type: ignore[arg-type]
    assert swa._average_model is not None
    assert not torch.equal(model.net[0].weight, swa._average_model.net[0].weight)


def test_resume_during_swa_continues_the_average(tmp_path: Path) -> None:
    def swa() -> StochasticWeightAveraging:
        return StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=3)

    whole = Small(scheduler=True)
    Trainer(max_epochs=EPOCHS, callbacks=[swa()], **quiet()).fit(whole, loader(n=16))

    ckpt = ModelCheckpoint(tmp_path, save_last=True, save_top_k=0)
    Trainer(max_epochs=3, callbacks=[swa(), ckpt], **quiet(enable_checkpointing=True)).fit(
        Small(scheduler=True), loader(n=16)
    )
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)["callbacks"]["StochasticWeightAveraging"]
    assert state["n_averaged"] == 2 and state["latest_update_epoch"] == 2 and state["scheduler_state"] is not None

    resumed = Small(scheduler=True)
    callback = swa()
    trainer = Trainer(max_epochs=EPOCHS, callbacks=[callback], **quiet())
    trainer.fit(resumed, loader(n=16), ckpt_path=str(tmp_path / "last.ckpt"))
    assert int(callback.n_averaged) == 4  # type: ignore[arg-type]
    assert resumed.lrs == pytest.approx(whole.lrs[3:], rel=0, abs=0)
    _same(resumed, whole)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"swa_lrs": 0.1, "swa_epoch_start": 0}, r"swa_epoch_start=0"),
        ({"swa_lrs": 0.1, "swa_epoch_start": 1.5}, r"swa_epoch_start=1.5"),
        ({"swa_lrs": -1.0}, r"swa_lrs=-1.0"),
        ({"swa_lrs": [0.1, 2]}, r"list of positive floats"),
        ({"swa_lrs": 0.1, "annealing_strategy": "step"}, r"'step'.*\['cos', 'linear'\]"),
        ({"swa_lrs": 0.1, "avg_fn": 3}, r"avg_fn"),
        ({"swa_lrs": 0.1, "device": 0}, r"device"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        StochasticWeightAveraging(**kwargs)


def test_sharded_strategies_and_several_optimizers_are_refused() -> None:
    class Sharded(SingleDeviceStrategy):
        @property
        def restore_checkpoint_after_setup(self) -> bool:
            return True

    trainer = Trainer(max_epochs=1, strategy=Sharded("cpu"), callbacks=[StochasticWeightAveraging(0.1)], **quiet())
    with pytest.raises(MisconfigurationError, match="SWA does not currently support sharded models \\(Sharded\\)"):
        trainer.fit(Small(), loader(n=8))

    class TwoOptimizers(Small):
        def configure_optimizers(self) -> Any:
            return [
                torch.optim.SGD(self.net[0].parameters(), lr=0.1),
                torch.optim.SGD(self.net[2].parameters(), lr=0.1),
            ]

        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            return None

    trainer = Trainer(max_epochs=1, callbacks=[StochasticWeightAveraging(0.1)], **quiet())
    with pytest.raises(
        MisconfigurationError, match="SWA currently works with 1 `optimizer`; configure_optimizers returned 2"
    ):
        trainer.fit(TwoOptimizers(), loader(n=8))
