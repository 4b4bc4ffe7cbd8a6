"""WeightAveraging / EMAWeightAveraging on real fits, against torch's AveragedModel driven by hand."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn
from trainer_helpers import loader, quiet

from phalanx.callbacks.model_checkpoint import ModelCheckpoint
from phalanx.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer


class Small(Module):
    """Linear + BatchNorm (buffers to average), no dropout: the reference loop reproduces it exactly."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
        self.val_weights: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0 and not self.trainer.sanity_checking:
            self.val_weights.append(self.net[0].weight.detach().clone())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def plain(model: nn.Module, data: Any, epochs: int, averaged: AveragedModel, update: Any) -> list[torch.Tensor]:
    """SGD by hand, updating ``averaged`` after the steps ``update(step_idx)`` selects; returns the
    averaged first-layer weight at the end of each epoch (what validation must see)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step, seen = 0, []
    for _ in range(epochs):
        model.train()
        for x, y in data:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            if update(step):
                averaged.update_parameters(model)
            step += 1
        seen.append(averaged.module.net[0].weight.detach().clone())
    return seen


def _same(a: nn.Module, b: nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_ema_equals_averaged_model_by_hand_and_validation_sees_the_average() -> None:
    model = Small()
    reference = copy.deepcopy(model)
    averaged = AveragedModel(reference, avg_fn=get_ema_avg_fn(0.9), use_buffers=True)
    expected_val = plain(reference, loader(n=24), 2, averaged, lambda step: True)
    trainer = Trainer(max_epochs=2, callbacks=[EMAWeightAveraging(decay=0.9)], **quiet())
    trainer.fit(model, loader(n=24), loader(n=8))
    _same(model.net, averaged.module.net)  # training ends with the average in the Module
    assert len(model.val_weights) == 2
    for want, got in zip(expected_val, model.val_weights):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_swa_default_and_custom_should_update() -> None:
    class EveryOther(WeightAveraging):
        def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
            return step_idx is not None and step_idx % 2 == 1

    model = Small()
    reference = copy.deepcopy(model)
    averaged = AveragedModel(reference, use_buffers=True)
    plain(reference, loader(n=24), 1, averaged, lambda step: step % 2 == 1)
    Trainer(max_epochs=1, callbacks=[EveryOther()], **quiet()).fit(model, loader(n=24))
    _same(model.net, averaged.module.net)
    assert int(averaged.n_averaged) == 3


def test_ema_starting_step_and_frequency() -> None:
    ema = EMAWeightAveraging(update_every_n_steps=2, update_starting_at_step=3, update_starting_at_epoch=1)
    assert [s for s in range(8) if ema.should_update(step_idx=s)] == [4, 6]
    assert [e for e in range(3) if ema.should_update(epoch_idx=e)] == [1, 2]
    with pytest.raises(MisconfigurationError, match=r"decay=1.5"):
        EMAWeightAveraging(decay=1.5)


def test_checkpoint_holds_the_average_and_a_resumed_fit_continues(tmp_path: Path) -> None:
    whole = Small()
    Trainer(max_epochs=3, callbacks=[EMAWeightAveraging(decay=0.8)], **quiet()).fit(whole, loader(n=16))

    first = Small()
    ckpt = ModelCheckpoint(tmp_path, save_last=True, save_top_k=0)
    ema = EMAWeightAveraging(decay=0.8)
    Trainer(max_epochs=2, callbacks=[ema, ckpt], **quiet(enable_checkpointing=True)).fit(first, loader(n=16))
    saved = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert ema._average_model is not None
    average = {k[len("module.") :]: v for k, v in ema._average_model.state_dict().items() if k.startswith("module.")}
    assert saved["state_dict"].keys() == average.keys() == saved["current_model_state"].keys()
    for key, value in average.items():
        assert torch.equal(saved["state_dict"][key], value), key
    assert int(saved["averaging_state"]["n_averaged"]) == 8
    assert not torch.equal(saved["current_model_state"]["net.0.weight"], saved["state_dict"]["net.0.weight"])

    resumed = Small()
    trainer = Trainer(max_epochs=3, callbacks=[EMAWeightAveraging(decay=0.8)], **quiet())
    trainer.fit(resumed, loader(n=16), ckpt_path=str(tmp_path / "last.ckpt"))
    assert trainer.global_step == 12
    _same(resumed, whole)  # a fresh average or training from the averaged weights would differ


def test_no_average_outside_fit_and_use_buffers_false() -> None:
    model = Small()
    callback = WeightAveraging(use_buffers=False, device="cpu")
    trainer = Trainer(callbacks=[callback], **quiet())
    trainer.validate(model, loader(n=8), verbose=False)
    assert callback._average_model is None
    with pytest.raises(MisconfigurationError, match=r"device=\[0\]"):
        WeightAveraging(device=[0])  # type: ignore[arg-type]
