"""MNIST as a DataModule: 55,000 / 5,000 train / validation split of the training set, and the test set.

:func:`MNIST` is torchvision's dataset when torchvision is installed (it downloads the files to
``data_dir`` in ``prepare_data``). Without torchvision, or offline, it reads the tensors torchvision
once wrote, ``<root>/MNIST/processed/training.pt`` and ``test.pt`` (each ``(images, labels)``), if
they are there; nothing else is fetched, and a missing file is an error that says where to put it.
Names and defaults are Lightning's demo's.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sized
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, random_split

from phalanx.datamodule import DataModule

__all__ = ["MNIST", "MNISTDataModule"]

_DATASETS_PATH = "./data"


class _ProcessedMNIST(Dataset[tuple[Tensor, int]]):
    """MNIST from torchvision's processed tensors, without torchvision: 1x28x28 float images and int labels."""

    def __init__(
        self,
        root: str,
        train: bool = True,
        normalize: tuple[float, float] | None = (0.1307, 0.3081),
        download: bool = True,
        **kwargs: Any,
    ) -> None:
        del download, kwargs  # nothing is fetched without torchvision; transforms need torchvision too
        path = os.path.join(root, "MNIST", "processed", "training.pt" if train else "test.pt")
        if not os.path.isfile(path):
            msg = (
                f"MNIST: {path} does not exist and torchvision is not installed to download it. Fix: pip install "
                "torchvision (it downloads MNIST), or place the (images, labels) tensors of the "
                f"{'training' if train else 'test'} set at that path."
            )
            raise RuntimeError(msg)
        self.data, self.targets = torch.load(path, weights_only=True)
        self.normalize = normalize

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        image = self.data[index].float().unsqueeze(0)
        if self.normalize is not None:
            mean, std = self.normalize
            image = (image - mean) / std
        return image, int(self.targets[index])

    def __len__(self) -> int:
        return len(self.data)


def MNIST(*args: Any, **kwargs: Any) -> Dataset[Any]:
    """torchvision's ``MNIST(root, train=..., download=..., transform=...)`` when torchvision is
    installed, else the processed tensors already on disk (see the module docstring)."""
    try:
        from torchvision.datasets import MNIST as TorchvisionMNIST
    except ImportError:
        return _ProcessedMNIST(*args, **kwargs)
    return TorchvisionMNIST(*args, **kwargs)  # type: ignore[no-any-return]


class MNISTDataModule(DataModule):
    """MNIST split into train / validation (``val_split`` images held out, seed 42) and test.

    Args:
        data_dir: Where the files are (downloaded to, with torchvision).
        val_split: Training images held out for validation.
        num_workers: DataLoader workers (0 on Windows, where worker processes are slow to start).
        normalize: Normalise images to mean 0.5, std 0.5 (with torchvision).
        seed: Kept for the hyperparameters; the split always uses seed 42, as Lightning's does.
        batch_size: Images per batch.
    """

    name = "mnist"

    def __init__(
        self,
        data_dir: str = _DATASETS_PATH,
        val_split: int = 5000,
        num_workers: int = 16,
        normalize: bool = False,
        seed: int = 42,
        batch_size: int = 32,
    ) -> None:
        super().__init__()
        if num_workers and sys.platform == "win32":
            warnings.warn(
                f"num_workers={num_workers} on Windows: using 0 (worker processes start slowly there)", stacklevel=2
            )
            num_workers = 0
        self.data_dir = data_dir
        self.val_split = val_split
        self.num_workers = num_workers
        self.normalize = normalize
        self.seed = seed
        self.batch_size = batch_size

    @property
    def num_classes(self) -> int:
        """Ten digits."""
        return 10

    def prepare_data(self) -> None:
        """Download both sets (with torchvision), once per machine."""
        MNIST(self.data_dir, train=True, download=True)
        MNIST(self.data_dir, train=False, download=True)

    def _dataset(self, train: bool) -> Dataset[Any]:
        transform = self.default_transforms
        extra = {"transform": transform} if transform is not None else {}
        return MNIST(self.data_dir, train=train, download=False, **extra)

    def setup(self, stage: str) -> None:
        dataset = self._dataset(train=True)
        assert isinstance(dataset, Sized)
        total = len(dataset)
        self.dataset_train, self.dataset_val = random_split(
            dataset, [total - self.val_split, self.val_split], generator=torch.Generator().manual_seed(42)
        )

    def _loader(self, dataset: Dataset[Any], *, shuffle: bool) -> DataLoader[Any]:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            drop_last=True,
            pin_memory=True,
        )

    def train_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.dataset_train, shuffle=True)

    def val_dataloader(self) -> DataLoader[Any]:
        return self._loader(self.dataset_val, shuffle=False)

    def test_dataloader(self) -> DataLoader[Any]:
        return self._loader(self._dataset(train=False), shuffle=False)

    @property
    def default_transforms(self) -> Callable[..., Any] | None:
        """torchvision's ``ToTensor`` (then ``Normalize(0.5, 0.5)`` with ``normalize``); None without torchvision."""
        try:
            from torchvision import transforms
        except ImportError:
            return None
        if self.normalize:
            return transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean=(0.5,), std=(0.5,))])
        return transforms.ToTensor()
