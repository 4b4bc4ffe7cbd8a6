"""``precision="float8"``: torchao's Float8Linear on every Linear, equal to torchao applied by hand.

Functional on a CPU (the float8 casts and scaled matmuls are emulated). Bad input: torchao missing
(the error names the package) and layers whose dimensions are not multiples of 16 (named, with the fix).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from trainer_helpers import quiet

from phalanx import Module, Trainer
from phalanx.errors import MisconfigurationError
from phalanx.precision import Float8Precision

pytestmark = pytest.mark.timeout(120)


def layers(out: int = 16) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, out))


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(3)
    return DataLoader(
        TensorDataset(torch.randn(64, 32, generator=generator), torch.randn(64, 16, generator=generator)), batch_size=16
    )


class Net(Module):
    def __init__(self, out: int = 16) -> None:
        super().__init__()
        self.net = layers(out)
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def test_float8_equals_torchao_by_hand() -> None:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = Net()
    trainer = Trainer(**quiet(max_epochs=2, precision="float8"))
    trainer.fit(model, data())
    assert isinstance(trainer.strategy.precision_plugin, Float8Precision)
    assert [type(m).__name__ for m in model.net] == ["Float8Linear", "Tanh", "Float8Linear"]

    reference = layers()
    convert_to_float8_training(reference, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
    optimizer = torch.optim.AdamW(reference.parameters(), lr=0.01)
    expected = []
    for _ in range(2):
        for x, y in data():
            loss = F.mse_loss(reference(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            expected.append(float(loss.detach()))
    assert len(model.losses) == len(expected) == 8
    assert max(abs(a - b) for a, b in zip(model.losses, expected, strict=True)) < 1e-6

    plain = Net()
    Trainer(**quiet(max_epochs=2)).fit(plain, data())
    assert plain.losses != model.losses  # float8 really changed the numerics
    assert max(abs(a - b) for a, b in zip(plain.losses, model.losses, strict=True)) < 0.05


def test_layers_it_cannot_convert_are_named_with_the_fix() -> None:
    model = Net(out=10)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(MisconfigurationError, match=r"cannot convert net\.2 \(64 -> 10\).*skip=\('net\.2',\)"):
        Trainer(**quiet(max_epochs=1, precision="float8")).fit(model, data())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with pytest.raises(MisconfigurationError, match="recipe='delayed'"):
        Float8Precision(recipe="delayed")


def test_without_torchao_the_error_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """An uninstalled torchao, as Python sees it: its import fails."""
    for name in [n for n in sys.modules if n == "torchao" or n.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)
    with pytest.raises(MisconfigurationError, match=r"'torchao' is not importable.*pip install torchao"):
        Float8Precision()
