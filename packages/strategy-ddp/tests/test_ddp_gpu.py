"""GPU-only ddp paths (CI has no GPU: these skip there, see docs/testing.md; CPU refusals are tested
in test_ddp_features.py).

``sync_batchnorm=True``: torch's SyncBatchNorm runs on CUDA only. The BatchNorm statistics after
one step must be those of all ranks' first batches together, computed here with plain PyTorch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddp_helpers import SCRIPTS, load_json, start_job
from test_ddp_features import COMMON

#: The marker for tests that need CUDA GPUs; CI has none, so it lists these as skipped.
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CI has none")

pytestmark = [requires_cuda, pytest.mark.timeout(300)]


def test_sync_batchnorm_normalises_over_every_ranks_batch(tmp_path: Path) -> None:
    devices = min(2, torch.cuda.device_count())
    job = start_job(tmp_path, "syncbn", str(SCRIPTS / "syncbn_gpu.py"), str(tmp_path), str(devices))
    assert job.wait(280) == 0, job.output()
    assert not job.leftovers()
    # Each rank's first batch under DistributedSampler(shuffle=False): samples rank, rank + n, ...
    torch.manual_seed(0)
    first = COMMON.build_layers()[0]
    x, _ = COMMON.dataset().tensors
    indices = [rank + devices * i for rank in range(devices) for i in range(COMMON.BATCH_SIZE)]
    with torch.no_grad():
        hidden = first(x[indices])
    mean, var = hidden.mean(0), hidden.var(0, unbiased=True)
    for rank in range(devices):
        facts = load_json(tmp_path / f"rank{rank}.json")
        assert facts["type"] == "SyncBatchNorm" and facts["backend"] == "nccl"
        torch.testing.assert_close(torch.tensor(facts["running_mean"]), mean, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(facts["running_var"]), var, atol=1e-5, rtol=1e-4)
