"""BatchSizeFinder and Tuner.scale_batch_size: the largest size below a memory limit the Module enforces."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.callbacks.batch_size_finder import BatchSizeFinder
from phalanx.errors import MisconfigurationError
from phalanx.tuner import Tuner


class Limited(Module):
    """Raises torch.OutOfMemoryError, as a GPU would, for batches larger than ``limit``."""

    def __init__(self, limit: int, n: int = 512) -> None:
        super().__init__()
        self.batch_size = 2
        self.limit = limit
        self.n = n
        self.layer = nn.Linear(3, 1)
        self.sizes_trained: list[int] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        if x.shape[0] > self.limit:
            msg = f"CUDA out of memory. Tried to allocate a batch of {x.shape[0]}"
            raise torch.OutOfMemoryError(msg)
        self.sizes_trained.append(x.shape[0])
        self.log("loss", 1.0)
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(self.n, 3, generator=generator), torch.randn(self.n, 1, generator=generator))
        return DataLoader(data, batch_size=self.batch_size)


def _trainer(tmp_path: Path, **kwargs: object) -> Trainer:
    return Trainer(
        accelerator="cpu", devices=1, default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
        enable_model_summary=False, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "limit", "expected"), [("power", 100, 64), ("binsearch", 100, 100), ("binsearch", 37, 37)]
)
def test_tuner_finds_largest_size_below_the_limit(tmp_path: Path, mode: str, limit: int, expected: int) -> None:
    model = Limited(limit)
    before = copy.deepcopy(model.state_dict())
    trainer = _trainer(tmp_path, max_epochs=1)
    found = Tuner(trainer).scale_batch_size(model, mode=mode, steps_per_trial=2)
    assert found == expected
    assert model.batch_size == expected
    for key, value in model.state_dict().items():  # weights restored after the trials
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    assert trainer.global_step == 0
    assert max(model.sizes_trained) == expected


def test_growth_stops_at_the_dataset_length(tmp_path: Path) -> None:
    model = Limited(limit=10_000, n=40)
    # Lightning stops growing once the size that succeeded is >= the dataset length
    assert Tuner(_trainer(tmp_path)).scale_batch_size(model, steps_per_trial=1) == 64
    model = Limited(limit=10_000, n=10_000)
    assert Tuner(_trainer(tmp_path)).scale_batch_size(model, steps_per_trial=1, max_trials=3) == 16


def test_callback_scales_before_fit_builds_its_dataloader(tmp_path: Path) -> None:
    model = Limited(limit=20, n=120)
    finder = BatchSizeFinder(mode="binsearch", steps_per_trial=1)
    trainer = _trainer(tmp_path, max_steps=2, callbacks=[finder])
    trainer.fit(model)
    assert finder.optimal_batch_size == 20
    model.sizes_trained.clear()
    assert trainer.train_dataloader.batch_size == 20  # the fit itself trained with the size found


def test_bad_configuration_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(MisconfigurationError, match="mode='power'"):
        BatchSizeFinder(mode="linear")
    model = Limited(limit=8)
    with pytest.raises(MisconfigurationError, match="batch_arg_name"):
        Tuner(_trainer(tmp_path)).scale_batch_size(model, batch_arg_name="bs")

    class GivenData(Limited):
        train_dataloader = Module.train_dataloader  # data only through fit(train_dataloaders=...)

    data = DataLoader(TensorDataset(torch.randn(8, 3), torch.randn(8, 1)), batch_size=2)
    with pytest.raises(MisconfigurationError, match=r"train_dataloader\(\)"):
        Tuner(_trainer(tmp_path)).scale_batch_size(GivenData(limit=8), train_dataloaders=data)
    with pytest.raises(MisconfigurationError, match="method='fit'"):
        Tuner(_trainer(tmp_path)).scale_batch_size(model, method="test")
