"""FSDP with plain SGD (an optimizer that keeps no per-parameter state): save, resume, compare.

``python stateless_optimizer.py OUT STATE_DICT_TYPE``: an uninterrupted 2-epoch run saving a
checkpoint after epoch 0, then a second Trainer resuming from it; rank 0 writes both final
full state dicts to OUT.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.callbacks import Callback
from phalanx_strategy_fsdp import FSDPStrategy


class Net(Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.05)  # no momentum: empty optimizer state


class SaveAfterFirstEpoch(Callback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_epoch_end(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        if trainer.current_epoch == 0:
            trainer.save_checkpoint(self.path)


def fit(state_dict_type: str, callbacks: list[Callback], ckpt_path: str | None) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(32, 6, generator=generator)
    loader = DataLoader(TensorDataset(x, x[:, :1] * 2), batch_size=4, shuffle=True, generator=generator)
    model = Net()
    trainer = Trainer(
        strategy=FSDPStrategy(state_dict_type=state_dict_type), accelerator="cpu", devices=2, max_epochs=2,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=callbacks,
    )
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def main() -> None:
    out, state_dict_type = sys.argv[1], sys.argv[2]
    path = os.path.join(out, f"epoch0-{state_dict_type}")
    uninterrupted = fit(state_dict_type, [SaveAfterFirstEpoch(path)], None)
    resumed = fit(state_dict_type, [], path)
    if int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) == 0:
        torch.save({"uninterrupted": uninterrupted, "resumed": resumed}, os.path.join(out, "weights.pt"))


if __name__ == "__main__":
    main()
