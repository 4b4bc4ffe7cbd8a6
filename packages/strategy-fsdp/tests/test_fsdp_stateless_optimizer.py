"""Resuming FSDP with an optimizer that keeps no per-parameter state (plain SGD).

torch's ``set_optimizer_state_dict`` cannot place an empty optimizer state and raises; phalanx then
restores only the param groups. The resumed run must end on the uninterrupted run's weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from phalanx.testing.processes import Job

SCRIPT = Path(__file__).parent / "scripts" / "stateless_optimizer.py"
pytestmark = pytest.mark.timeout(200)


@pytest.mark.parametrize("state_dict_type", ["sharded", "full"])
def test_resume_with_plain_sgd_matches_the_uninterrupted_run(tmp_path: Path, state_dict_type: str) -> None:
    job = Job([sys.executable, str(SCRIPT), str(tmp_path), state_dict_type], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    assert job.wait(timeout=150) == 0, job.output()
    assert job.leftovers() == [], job.output()
    weights = torch.load(tmp_path / "weights.pt")
    for name, expected in weights["uninterrupted"].items():
        assert torch.equal(weights["resumed"][name], expected), name
