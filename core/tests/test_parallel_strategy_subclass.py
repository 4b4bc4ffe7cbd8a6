"""ParallelStrategy is a complete base: a subclass that overrides only ``wrap_model`` trains for real.

The script wraps in torch's own DistributedDataParallel and nothing else; launching (every start
method), ranks, the process group and data sharding come from the base. The final weights equal a
plain single-process loop over the same global batches (DDP averages the two ranks' gradients of
equal shards, which is the gradient of the global batch's mean loss).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from phalanx.testing.processes import Job

SCRIPT = Path(__file__).parent / "strategy_scripts" / "wrap_only.py"
pytestmark = pytest.mark.timeout(150)


def _plain_reference() -> dict[str, torch.Tensor]:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from wrap_only import Regression, data
    finally:
        sys.path.remove(str(SCRIPT.parent))
    model = Regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = data()
    shards = [DistributedSampler(dataset, num_replicas=2, rank=r, shuffle=False, seed=0) for r in range(2)]
    for epoch in range(2):
        for sampler in shards:
            sampler.set_epoch(epoch)
        batches = [list(DataLoader(dataset, batch_size=4, sampler=s)) for s in shards]
        for (x0, y0), (x1, y1) in zip(*batches):
            optimizer.zero_grad()
            loss = (nn.functional.mse_loss(model.layer(x0), y0) + nn.functional.mse_loss(model.layer(x1), y1)) / 2
            loss.backward()
            optimizer.step()
    return model.state_dict()


@pytest.mark.parametrize("start_method", ["popen", "spawn", "fork"])
def test_subclass_overriding_only_wrap_model_trains_on_two_processes(tmp_path: Path, start_method: str) -> None:
    job = Job([sys.executable, str(SCRIPT), start_method, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=120)
    assert code == 0, job.output()
    assert job.leftovers() == [], job.output()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks == [{"world": 2, "wrapped": "DistributedDataParallel"}] * 2
    trained = torch.load(tmp_path / "weights.pt")
    for name, expected in _plain_reference().items():
        assert torch.allclose(trained[name], expected, atol=1e-6), (name, trained[name], expected)
