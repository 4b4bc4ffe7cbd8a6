"""DeepSpeedStrategy(activation_checkpointing_policy=...): the option fsdp and model_parallel take.

One 2-rank job (scripts/ds_activation_checkpointing.py) trains ZeRO-2 without checkpointing, with
full and with selective checkpointing of every Block, and ZeRO-3 without and with full: losses
are bit-identical to the run without it (recomputation repeats the same kernels), and torch's
MemTracker measures a lower peak over the first step (full < selective < none).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from ds_helpers import pytest_timeout_for, run_command
from torch import nn

from phalanx.errors import MisconfigurationError
from phalanx_strategy_deepspeed import DeepSpeedStrategy

pytestmark = pytest.mark.timeout(pytest_timeout_for(runs=1))

SCRIPT = Path(__file__).parent / "scripts" / "ds_activation_checkpointing.py"
RUNS = [
    {"tag": "zero2", "stage": 2, "ac": None},
    {"tag": "zero2_full", "stage": 2, "ac": "full"},
    {"tag": "zero2_selective", "stage": 2, "ac": "selective"},
    {"tag": "zero3", "stage": 3, "ac": None},
    {"tag": "zero3_full", "stage": 3, "ac": "full"},
]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ds_ac")
    result = run_command([sys.executable, str(SCRIPT), str(out), json.dumps(RUNS)], cwd=out)
    assert result.returncode == 0, result.stdout[-6000:]
    results = [json.loads((out / f"ac_rank{r}.json").read_text()) for r in range(2)]
    for rank, by_tag in enumerate(results):
        print(f"rank {rank}: " + ", ".join(f"{tag} {r['peak']} B" for tag, r in by_tag.items()))
    return results


def test_losses_are_bit_identical(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        assert len(result["zero2"]["losses"]) == 2
        assert result["zero2_full"]["losses"] == result["zero2"]["losses"]
        assert result["zero2_selective"]["losses"] == result["zero2"]["losses"]
        assert result["zero3_full"]["losses"] == result["zero3"]["losses"]


def test_peak_memory_is_lower(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        assert result["zero2_full"]["peak"] < result["zero2_selective"]["peak"] < result["zero2"]["peak"]
        assert result["zero3_full"]["peak"] < result["zero3"]["peak"]


def test_bad_policies_are_refused_at_construction() -> None:
    with pytest.raises(MisconfigurationError, match=r"DeepSpeedStrategy\(activation_checkpointing_policy='full'\)"):
        DeepSpeedStrategy(activation_checkpointing_policy="full")
    with pytest.raises(MisconfigurationError, match="accepted:"):
        DeepSpeedStrategy(activation_checkpointing_policy=[nn.Linear, 3])
    strategy = DeepSpeedStrategy(activation_checkpointing_policy={nn.Linear})
    assert strategy.activation_checkpointing_policy is not None
    assert strategy.activation_checkpointing_policy.mode == "full"
