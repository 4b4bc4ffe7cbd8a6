"""Model, data and hyper-parameters shared by the phalanx run and the plain torchrun reference."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

FEATURES, HIDDEN, OUTPUTS, SAMPLES, BATCH, LR, STEPS = 6, 8, 3, 64, 4, 0.1, 7
#: SGD momentum: local SGD must average the optimizer state too, which this makes observable.
MOMENTUM = 0.9


def make_layers() -> torch.nn.Sequential:
    """The same initial weights on every rank and in both programs."""
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUTPUTS))


def make_dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randn(SAMPLES, FEATURES, generator=g), torch.randn(SAMPLES, OUTPUTS, generator=g))
