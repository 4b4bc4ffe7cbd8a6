"""Tiny random models and data for tests, bug reports and trying a feature in a few lines.

Everything here is deterministic given ``seed_everything`` and small enough to run on a CPU in
milliseconds: 32 features, 64 samples, a ``Linear(32, 2)`` model. The shapes, defaults and
optimizer settings are Lightning's, so a bug report written with Lightning's boring classes
reproduces here after the rename. Subclass and override what your case needs::

    class Exploding(BoringModel):
        def training_step(self, batch, batch_idx):
            return {"loss": self.step(batch) * float("inf")}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from phalanx.core.optimizer import LightningOptimizer
from phalanx.datamodule import DataModule
from phalanx.module import Module
from phalanx.utilities.apply_func import apply_to_collection

__all__ = [
    "BoringDataModule",
    "BoringDataModuleNoLen",
    "BoringModel",
    "DemoModel",
    "IterableBoringDataModule",
    "ManualOptimBoringModel",
    "Net",
    "RandomDataset",
    "RandomDictDataset",
    "RandomIterableDataset",
    "RandomIterableDatasetWithLen",
]


class RandomDataset(Dataset[Tensor]):
    """``length`` random vectors of ``size`` features, drawn once when the dataset is built."""

    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> Tensor:
        return self.data[index]

    def __len__(self) -> int:
        return self.len


class RandomDictDataset(Dataset[dict[str, Tensor]]):
    """Like :class:`RandomDataset`, each item a dict: ``{"a": x, "b": x + 2}``."""

    def __init__(self, size: int, length: int) -> None:
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        sample = self.data[index]
        return {"a": sample, "b": sample + 2}

    def __len__(self) -> int:
        return self.len


class RandomIterableDataset(IterableDataset[Tensor]):
    """``count`` fresh random vectors of ``size`` features per pass, and no length."""

    def __init__(self, size: int, count: int) -> None:
        self.count = count
        self.size = size

    def __iter__(self) -> Iterator[Tensor]:
        for _ in range(self.count):
            yield torch.randn(self.size)


class RandomIterableDatasetWithLen(IterableDataset[Tensor]):
    """:class:`RandomIterableDataset` that also reports its length (``count``)."""

    def __init__(self, size: int, count: int) -> None:
        self.count = count
        self.size = size

    def __iter__(self) -> Iterator[Tensor]:
        for _ in range(len(self)):
            yield torch.randn(self.size)

    def __len__(self) -> int:
        return self.count


def _random_loader() -> DataLoader[Tensor]:
    return DataLoader(RandomDataset(32, 64))


class BoringModel(Module):
    """One ``Linear(32, 2)`` layer regressing every output towards 1; each dataloader is 64 random vectors.

    ``training_step`` returns ``{"loss": ...}``, ``validation_step`` ``{"x": ...}`` and
    ``test_step`` ``{"y": ...}``; the optimizer is SGD (lr 0.1) with a StepLR stepping every epoch.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)

    def loss(self, preds: Tensor, labels: Tensor | None = None) -> Tensor:
        """Mean squared error against ``labels``, ones by default."""
        return F.mse_loss(preds, torch.ones_like(preds) if labels is None else labels)

    def step(self, batch: Any) -> Tensor:
        """The loss of the model's output for ``batch``."""
        return self.loss(self(batch))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return {"loss": self.step(batch)}

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        return {"x": self.step(batch)}

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        return {"y": self.step(batch)}

    def configure_optimizers(self) -> tuple[list[torch.optim.Optimizer], list[LRScheduler]]:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]

    def train_dataloader(self) -> DataLoader[Tensor]:
        return _random_loader()

    def val_dataloader(self) -> DataLoader[Tensor]:
        return _random_loader()

    def test_dataloader(self) -> DataLoader[Tensor]:
        return _random_loader()

    def predict_dataloader(self) -> DataLoader[Tensor]:
        return _random_loader()


class BoringDataModule(DataModule):
    """256 random vectors of 32 features, split into four disjoint blocks of 64: train, val, test, predict.

    The data is drawn when the DataModule is built; ``setup(stage)`` selects the stage's blocks.
    """

    def __init__(self) -> None:
        super().__init__()
        self.random_full = RandomDataset(32, 64 * 4)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = Subset(self.random_full, indices=range(64))
        if stage in ("fit", "validate"):
            self.random_val = Subset(self.random_full, indices=range(64, 128))
        if stage == "test":
            self.random_test = Subset(self.random_full, indices=range(128, 192))
        if stage == "predict":
            self.random_predict = Subset(self.random_full, indices=range(192, 256))

    def train_dataloader(self) -> DataLoader[Tensor]:
        return DataLoader(self.random_train)

    def val_dataloader(self) -> DataLoader[Tensor]:
        return DataLoader(self.random_val)

    def test_dataloader(self) -> DataLoader[Tensor]:
        return DataLoader(self.random_test)

    def predict_dataloader(self) -> DataLoader[Tensor]:
        return DataLoader(self.random_predict)


class BoringDataModuleNoLen(DataModule):
    """Iterable datasets without a length: 512 training, 128 validation, 256 test and 64 predict vectors."""

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.random_train = RandomIterableDataset(32, 512)
        if stage in ("fit", "validate"):
            self.random_val = RandomIterableDataset(32, 128)
        if stage == "test":
            self.random_test = RandomIterableDataset(32, 256)
        if stage == "predict":
            self.random_predict = RandomIterableDataset(32, 64)

    def train_dataloader(self) -> DataLoader[Tensor]:
        return DataLoader(self.random_train)

    def val_dataloader(self) -> DataLoader[Tensor]:
        return DataLoader(self.random_val)

    def test_dataloader(self) -> DataLoader[Tensor]:
        return DataLoader(self.random_test)

    def predict_dataloader(self) -> DataLoader[Tensor]:
        return DataLoader(self.random_predict)


def _loaders(datasets: list[Any]) -> list[Any]:
    return apply_to_collection(datasets, Dataset, DataLoader)  # type: ignore[no-any-return]


class IterableBoringDataModule(DataModule):
    """Each stage gets two dataloaders of 4-feature vectors, one map-style and one iterable, of equal size
    (16 for training, 32 validation, 64 test, 128 predict)."""

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.train_datasets = [RandomDataset(4, 16), RandomIterableDataset(4, 16)]
        if stage in ("fit", "validate"):
            self.val_datasets = [RandomDataset(4, 32), RandomIterableDataset(4, 32)]
        if stage == "test":
            self.test_datasets = [RandomDataset(4, 64), RandomIterableDataset(4, 64)]
        if stage == "predict":
            self.predict_datasets = [RandomDataset(4, 128), RandomIterableDataset(4, 128)]

    def train_dataloader(self) -> Any:
        return _loaders(self.train_datasets)

    def val_dataloader(self) -> Any:
        return _loaders(self.val_datasets)

    def test_dataloader(self) -> Any:
        return _loaders(self.test_datasets)

    def predict_dataloader(self) -> Any:
        return _loaders(self.predict_datasets)


class ManualOptimBoringModel(BoringModel):
    """:class:`BoringModel` with manual optimization: the step zeroes, backpropagates and steps itself."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        optimizer = self.optimizers()
        assert isinstance(optimizer, (torch.optim.Optimizer, LightningOptimizer))
        loss = self.step(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


class DemoModel(Module):
    """``relu(Linear(32, out_dim))`` trained to shrink its summed output, with Adam at ``learning_rate``."""

    def __init__(self, out_dim: int = 10, learning_rate: float = 0.02) -> None:
        super().__init__()
        self.l1 = nn.Linear(32, out_dim)
        self.learning_rate = learning_rate

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch: Any, batch_nb: int) -> Any:
        return self(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.learning_rate)


class Net(nn.Module):
    """The classic MNIST convnet (two convolutions, max-pooling, dropout, two linear layers), as a
    plain ``nn.Module``; returns log-probabilities over the 10 digits for 1x28x28 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)
