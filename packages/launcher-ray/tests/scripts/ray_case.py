"""The model, data and hyper-parameters every run of these tests shares (Ray runs and plain torchrun).

Plain PyTorch only: the reference imports it too. The phalanx side is ray_modules.py. Ray workers
import both by name (the test's cluster puts this folder on their PYTHONPATH).
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

FEATURES, HIDDEN, OUTPUTS, SAMPLES, BATCH, LR, MOMENTUM = 6, 8, 3, 64, 4, 0.1, 0.9
#: 2 ranks x 4 samples per step: 8 steps an epoch, so 12 steps end in the middle of epoch 1.
STEPS = 12
#: local_sgd's registered default: parameters and momentum averaged every 4 steps.
SYNC_EVERY = 4


def make_layers() -> torch.nn.Sequential:
    """The same initial weights on every rank and in every program."""
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUTPUTS))


def make_dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randn(SAMPLES, FEATURES, generator=g), torch.randn(SAMPLES, OUTPUTS, generator=g))


def full_state(layers: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (FSDP's DTensor shards gathered: a collective, so every rank calls it)."""
    from torch.distributed.tensor import DTensor

    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for name, p in layers.named_parameters()
    }
