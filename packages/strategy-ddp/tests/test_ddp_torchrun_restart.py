"""Restarts: under ``torchrun --max-restarts=1`` a rank that crashes once costs only the steps
since the newest checkpoint; ``fit(ckpt_path="last")`` is the switch that resumes by itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from phalanx.testing.processes import Job

SCRIPT = Path(__file__).parent / "scripts" / "restart.py"
pytestmark = pytest.mark.timeout(240)


def _torchrun(out: Path, crash: bool) -> Job:
    out.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", "1", "--monitor-interval", "0.5", str(SCRIPT), str(out), "1" if crash else "0",
    ]
    return Job(command, out, env={"OMP_NUM_THREADS": "1"}, warm=True)


def test_a_rank_crashing_once_is_restarted_and_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    clean = _torchrun(tmp_path / "clean", crash=False)
    assert clean.wait(timeout=100) == 0, clean.output()
    crashed = _torchrun(tmp_path / "crashed", crash=True)
    assert crashed.wait(timeout=100) == 0, crashed.output()
    for job in (clean, crashed):
        assert job.leftovers() == [], job.output()
    assert (tmp_path / "crashed" / "crashed").exists(), "the crash did not happen"
    assert "deliberate crash at step 5" in crashed.output()
    assert (tmp_path / "clean" / "starts.txt").read_text().split() == ["0"]
    # the restarted attempt resumed from the step-4 checkpoint: one step lost, not five
    assert (tmp_path / "crashed" / "starts.txt").read_text().split() == ["0", "4"]
    expected = torch.load(tmp_path / "clean" / "weights.pt")
    resumed = torch.load(tmp_path / "crashed" / "weights.pt")
    for name, value in expected.items():
        assert torch.equal(resumed[name], value), name
