"""save_checkpoint, validate, test and predict after fit, under every multi-process strategy.

Each run trains 6 steps on 2 ranks, then uses the same Trainer again; every number is compared
with a plain PyTorch loop computed here, in the test process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rel_common import reference_loss, reference_predictions, reference_weights
from reliability_helpers import rank_results, run_job

#: One job per entry; the DeepSpeed stages share one job (importing deepspeed is most of the cost).
JOBS = ["ddp", "ddp_spawn", "fsdp", "deepspeed_stage_1,deepspeed_stage_2,deepspeed_stage_3"]
#: ZeRO flattens and averages gradients in its own buffers: same math, other rounding.
TOLERANCE = {"deepspeed_stage_1": 1e-5, "deepspeed_stage_2": 1e-5, "deepspeed_stage_3": 1e-5}


@pytest.mark.timeout(260)
@pytest.mark.parametrize("strategies", JOBS)
def test_everything_after_fit_matches_plain_torch(tmp_path: Path, strategies: str) -> None:
    code, job = run_job(tmp_path, "after_fit.py", strategies, str(tmp_path), timeout=240, name="after_fit")
    assert code == 0, job.output()[-6000:]
    for strategy in strategies.split(","):
        results = rank_results(tmp_path / strategy)
        assert 0 in results, f"{strategy}: rank 0 wrote nothing\n{job.output()[-4000:]}"
        _check(strategy, results)


def _check(strategy: str, results: dict[int, dict]) -> None:
    tol = TOLERANCE.get(strategy, 1e-6)
    expected = reference_weights(steps=6)
    for rank, result in results.items():
        for name, values in result["weights"].items():
            got = torch.tensor(values)
            assert torch.allclose(got, expected[name].flatten(), atol=tol, rtol=0), (strategy, rank, name)
        assert result["saved"], f"{strategy}: save_checkpoint after fit wrote nothing"
        assert result["val_loss"] == pytest.approx(reference_loss(expected, 1), abs=tol)
        assert result["test_loss"] == pytest.approx(reference_loss(expected, 2), abs=tol)
        # a fresh Module loaded from the checkpoint saved after fit validates to the same loss
        assert result["reloaded_val_loss"] == pytest.approx(reference_loss(expected, 1), abs=tol)
        rows = torch.tensor(result["predictions"])
        assert rows.shape[0] >= 8, f"{strategy}: rank {rank} predicted {rows.shape[0]} rows"
        want = reference_predictions(expected, rows[:, :8])
        assert torch.allclose(rows[:, 8:], want, atol=tol, rtol=0), strategy
