"""OnExceptionCheckpoint: a failing fit leaves a checkpoint that loads and resumes to the same
weights as an uninterrupted run; a fit that ends normally leaves none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from trainer_helpers import loader, quiet

from phalanx.callbacks.checkpoint import Checkpoint
from phalanx.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer


class Boom(RuntimeError):
    pass


class Net(Module):
    def __init__(self, fail_at_step: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(6, 1)
        self.fail_at_step = fail_at_step

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fail_at_step:
            raise Boom("scripted failure")
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _trainer(tmp_path: Path, *callbacks: Any) -> Trainer:
    return Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=list(callbacks), max_epochs=2,
                   **quiet(enable_model_summary=False))  # fmt: skip


def test_a_failing_fit_saves_a_checkpoint_that_resumes(tmp_path: Path) -> None:
    callback = OnExceptionCheckpoint(tmp_path / "ckpts")
    assert isinstance(callback, Checkpoint)
    failing = Net(fail_at_step=13)  # in the second epoch (10 batches per epoch)
    with pytest.raises(Boom):
        _trainer(tmp_path, callback).fit(failing, loader())
    path = tmp_path / "ckpts" / "on_exception.ckpt"
    assert callback.ckpt_path == str(path) and path.exists()
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint["global_step"] == 13
    torch.testing.assert_close(checkpoint["state_dict"]["layer.weight"], failing.layer.weight, rtol=0, atol=0)

    resumed = Net()
    trainer = _trainer(tmp_path, OnExceptionCheckpoint(tmp_path / "ckpts"))
    trainer.fit(resumed, loader(), ckpt_path=str(path))
    reference = Net()  # the same fit without the failure
    _trainer(tmp_path / "ref").fit(reference, loader())
    assert trainer.global_step == 20
    torch.testing.assert_close(resumed.layer.weight, reference.layer.weight, rtol=0, atol=0)
    assert not path.exists()  # the successful stage removed the stale file


def test_a_successful_fit_leaves_no_checkpoint(tmp_path: Path) -> None:
    callback = OnExceptionCheckpoint(tmp_path, filename="crash")
    _trainer(tmp_path, callback).fit(Net(), loader(n=8))
    assert not (tmp_path / "crash.ckpt").exists()


def test_empty_filename_is_an_error() -> None:
    with pytest.raises(MisconfigurationError, match="cannot be empty"):
        OnExceptionCheckpoint("x", filename="")
