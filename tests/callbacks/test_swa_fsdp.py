"""StochasticWeightAveraging refuses FSDP (as Lightning does) on a real two-rank FSDP run.

The test runs this file as a script (``python test_swa_fsdp.py OUT``) with ``strategy="fsdp"`` on two
CPU processes over gloo: both ranks must stop at setup with the error naming the strategy and the fix,
and leave no process behind.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx.callbacks.stochastic_weight_avg import StochasticWeightAveraging
from phalanx.module import Module
from phalanx.testing.processes import Job
from phalanx.trainer.trainer import Trainer


class Net(Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.timeout(200)
def test_swa_refuses_fsdp_on_every_rank(tmp_path: Path) -> None:
    job = Job([sys.executable, __file__, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=180)
    assert code != 0, job.output()
    assert job.leftovers() == [], job.output()
    assert "SWA does not currently support sharded models (FSDPStrategy)" in job.output()
    assert not (tmp_path / "trained").exists()  # no rank got past setup


def _rank_main(out: str) -> None:
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    trainer = Trainer(accelerator="cpu", devices=2, strategy="fsdp", callbacks=[StochasticWeightAveraging(0.01)],
                      max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)  # fmt: skip
    trainer.fit(Net(), DataLoader(TensorDataset(x), batch_size=2))
    (Path(out) / "trained").write_text("fit ran")


if __name__ == "__main__":
    _rank_main(sys.argv[1])
