"""Run under ``torchrun --max-restarts=1``: rank 1 crashes once at step 5, torchrun restarts the
group, and ``fit(ckpt_path="last")`` resumes from the newest complete checkpoint (step 4).

``python -m torch.distributed.run --nproc-per-node 2 --max-restarts 1 restart.py OUT CRASH``:
``CRASH`` is 1 to crash once (a marker file in OUT records that it happened), 0 for the
uninterrupted run. Rank 0 writes the final weights to ``OUT/weights.pt``.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.callbacks import ModelCheckpoint


class Net(Module):
    def __init__(self, out: str, crash: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.out, self.crash = out, crash

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        marker = os.path.join(self.out, "crashed")
        if self.crash and self.global_step == 5 and self.global_rank == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("deliberate crash at step 5")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_start(self) -> None:
        if self.global_rank == 0:  # where each attempt starts: 0, then the resumed step
            with open(os.path.join(self.out, "starts.txt"), "a") as fh:
                fh.write(f"{self.global_step}\n")

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    out, crash = sys.argv[1], sys.argv[2] == "1"
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(48, 4, generator=generator)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4, shuffle=True)
    torch.manual_seed(2)  # the shuffle order: same in every attempt
    model = Net(out, crash)
    trainer = Trainer(
        accelerator="cpu", strategy="ddp", devices=2, max_epochs=2, logger=False, enable_progress_bar=False,
        default_root_dir=out, callbacks=[ModelCheckpoint(os.path.join(out, "ckpt"), every_n_train_steps=2, save_top_k=-1)],
    )
    trainer.fit(model, loader, ckpt_path="last")
    if trainer.is_global_zero:
        torch.save(model.state_dict(), os.path.join(out, "weights.pt"))


if __name__ == "__main__":
    main()
