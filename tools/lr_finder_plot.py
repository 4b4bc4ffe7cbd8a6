"""Draw docs/img/lr_finder.png: the LR finder's curve on a small classifier (CPU, a few seconds).

Usage: ``python tools/lr_finder_plot.py [OUT.png]``. The docs page on tuning shows this image; rerun
the script after changing the finder or its plot.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer, seed_everything
from phalanx.tuner import Tuner

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "lr_finder.png"


class Classifier(Module):
    """A two-layer MLP on 3 Gaussian blobs."""

    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 3))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        centers = torch.randn(3, 8, generator=generator) * 2
        y = torch.randint(0, 3, (4096,), generator=generator)
        x = centers[y] + torch.randn(4096, 8, generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=generator)


def main(out: Path = OUT) -> float | None:
    """Run the finder and write the plot to ``out``; returns the suggested rate."""
    seed_everything(0)
    model = Classifier()
    with tempfile.TemporaryDirectory() as root:
        trainer = Trainer(accelerator="cpu", devices=1, max_epochs=3, default_root_dir=root, logger=False)
        finder = Tuner(trainer).lr_find(model, min_lr=1e-4, max_lr=10.0, num_training=120)
    assert finder is not None
    figure = finder.plot(suggest=True)
    suggestion = finder.suggestion()
    figure.axes[0].set_title(f"LR finder: suggested lr = {suggestion:.3g}")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100, bbox_inches="tight")
    print(f"suggested lr {suggestion:.4g}; plot written to {out}")
    return suggestion


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
