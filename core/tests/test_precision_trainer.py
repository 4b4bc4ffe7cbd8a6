"""Every precision (and alias) trains on CPU; 64-true and the mixed precisions match plain loops."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import nn
from trainer_helpers import LossRecorder, Net, loader, quiet

from phalanx.trainer.trainer import Trainer

CASES = [
    ("32-true", "32-true", torch.float32),
    (32, "32-true", torch.float32),
    ("32", "32-true", torch.float32),
    ("64-true", "64-true", torch.float64),
    (64, "64-true", torch.float64),
    ("16-mixed", "16-mixed", torch.float32),
    (16, "16-mixed", torch.float32),
    ("16", "16-mixed", torch.float32),
    ("bf16-mixed", "bf16-mixed", torch.float32),
    ("bf16", "bf16-mixed", torch.float32),
    ("16-true", "16-true", torch.float16),
    ("bf16-true", "bf16-true", torch.bfloat16),
]


@pytest.mark.parametrize(("precision", "canonical", "dtype"), CASES, ids=[repr(c[0]) for c in CASES])
def test_every_precision_fits_on_cpu(precision: Any, canonical: str, dtype: torch.dtype) -> None:
    recorder = LossRecorder()
    model = Net(lr=0.01)
    trainer = Trainer(max_steps=4, precision=precision, gradient_clip_val=1.0, callbacks=[recorder], **quiet())
    trainer.fit(model, loader())
    assert trainer.precision == canonical
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert len(recorder.losses) == 4 and all(math.isfinite(loss.item()) for loss in recorder.losses)
    (result,) = trainer.validate(model, loader(n=8), verbose=False)
    assert math.isfinite(result["val_loss"])


def _plain_amp(
    model: Net, dtype: torch.dtype, *, scaler: torch.amp.GradScaler | None, clip: float
) -> list[torch.Tensor]:
    optimizer = model.make_optimizer(model.parameters())
    losses = []
    for x, y in loader():
        with torch.autocast("cpu", dtype=dtype):
            loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_mixed_precision_matches_plain_autocast_loop(precision: str) -> None:
    torch.manual_seed(0)
    reference = Net()
    model = copy.deepcopy(reference)
    dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    torch.manual_seed(1)
    expected = _plain_amp(reference, dtype, scaler=scaler, clip=0.5)
    recorder = LossRecorder()
    torch.manual_seed(1)
    trainer = Trainer(max_epochs=1, precision=precision, gradient_clip_val=0.5, callbacks=[recorder], **quiet())
    trainer.fit(model, loader())
    assert all(torch.equal(a, b) for a, b in zip(expected, recorder.losses))
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
    if scaler is not None:
        assert trainer.precision_plugin.state_dict()["scale"] == scaler.get_scale()


def test_double_precision_matches_plain_double_loop() -> None:
    torch.manual_seed(0)
    reference = Net()
    model = copy.deepcopy(reference)
    reference.double()
    optimizer = reference.make_optimizer(reference.parameters())
    torch.manual_seed(1)
    expected = []
    for x, y in loader():
        loss = nn.functional.mse_loss(reference(x.double()), y.double())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        expected.append(loss.detach())
    recorder = LossRecorder()
    torch.manual_seed(1)
    Trainer(max_epochs=1, precision="64-true", callbacks=[recorder], **quiet()).fit(model, loader())
    assert all(torch.equal(a, b) for a, b in zip(expected, recorder.losses))
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
