"""ModelSummary under FSDP on two ranks counts the whole model, not the local shard.

The test runs this file as a script (``python test_summary_fsdp.py OUT``) with ``strategy="fsdp"``
on two CPU processes over gloo; each rank records what ``summarize`` counted and what its shard holds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx.callbacks.callback import Callback
from phalanx.callbacks.model_summary import ModelSummary, summarize
from phalanx.module import Module
from phalanx.testing.processes import Job
from phalanx.trainer.trainer import Trainer


class Net(Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


EXPECTED = 8 * 32 + 32 + 32 * 3 + 3  # 387


class Record(Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        summary = summarize(pl_module, max_depth=2)
        local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in pl_module.parameters())
        record = {"total": summary.total_parameters, "layers": summary.param_nums, "local": local,
                  "size_mb": summary.model_size}  # fmt: skip
        (Path(self.out) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


@pytest.mark.timeout(200)
def test_fsdp_summary_counts_global_parameters(tmp_path: Path) -> None:
    assert sum(p.numel() for p in Net().parameters()) == EXPECTED  # the plain-PyTorch count
    job = Job([sys.executable, __file__, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=180)
    assert code == 0, job.output()
    assert job.leftovers() == [], job.output()
    for rank in range(2):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["local"] < EXPECTED  # the parameters really are sharded
        assert record["total"] == EXPECTED and record["layers"] == [EXPECTED, 8 * 32 + 32, 0, 32 * 3 + 3]
        assert record["size_mb"] == pytest.approx(EXPECTED * 4e-6)
    assert "387       Total params" in job.output()  # what the ModelSummary callback printed on rank 0


def _rank_main(out: str) -> None:
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    trainer = Trainer(accelerator="cpu", devices=2, strategy="fsdp", callbacks=[ModelSummary(), Record(out)],
                      max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)  # fmt: skip
    trainer.fit(Net(), DataLoader(TensorDataset(x), batch_size=2))


if __name__ == "__main__":
    _rank_main(sys.argv[1])
