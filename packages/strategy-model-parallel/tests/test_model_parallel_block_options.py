"""ModelParallelStrategy's per-block options: activation checkpointing and regional compile.

One 2-rank job (scripts/block_options.py, ``data_parallel_size=2``, three Blocks each
``fully_shard``-ed in ``configure_model``) runs every fit, then plain ``fully_shard`` on the same
ranks:

- checkpointing (Lightning's ``{Block}``, full, selective) recomputes without changing a bit of
  the losses. That it really ran is counted: the Blocks' Python ``forward`` runs twice per step,
  and the first step's matmuls show full recomputing the (saved-for-backward) matmul of each
  Block while selective keeps it.
- regional compile (``compile_policy={Block}``, backend ``aot_eager``, alone and over selective
  checkpointing) loses within 1e-4 of eager, and every Block call ran the compiled graph.
- a policy that matches no submodule fails every rank with one error naming the model's classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mp_testing import read_ranks, run_script

pytestmark = pytest.mark.timeout(200)

BLOCKS, STEPS = 3, 4  # 64 samples / global batch 16, one epoch
RUNS = [
    {"tag": "eager"},
    {"tag": "ac_lightning", "ac": "lightning"},
    {"tag": "ac_full", "ac": "full"},
    {"tag": "ac_selective", "ac": "selective"},
    {"tag": "compiled", "compile": "aot_eager"},
    {"tag": "compiled_ac", "compile": "aot_eager", "ac": "selective"},
    {"tag": "bad_ac", "bad": "ac"},
    {"tag": "bad_compile", "bad": "compile"},
]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], str]:
    """Each rank's facts and the job's output."""
    out = tmp_path_factory.mktemp("model_parallel_blocks")
    _, output, seconds = run_script("block_options.py", str(out), json.dumps(RUNS), timeout=150)
    print(f"block options job: {seconds:.1f} s")
    return read_ranks(Path(out), "blocks", 2), output


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == STEPS
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_eager_fit_equals_plain_fully_shard(job: tuple[list[dict[str, Any]], str]) -> None:
    ranks, _ = job
    for result in ranks:
        assert _max_diff(result["eager"]["losses"], result["plain"]["losses"]) < 1e-6
        assert result["eager"]["block_calls"] == BLOCKS * STEPS
    first, last = (sum(result["eager"]["losses"][step] for result in ranks) for step in (0, -1))
    assert last < first  # the global batch's loss falls (one rank's shard alone may not, in 4 steps)
    assert ranks[0]["eager"]["losses"] != ranks[1]["eager"]["losses"]  # each rank its own shard


def test_activation_checkpointing_recomputes_without_changing_the_losses(job: tuple[list[dict[str, Any]], str]) -> None:
    ranks, _ = job
    for result in ranks:
        eager = result["eager"]
        for tag in ("ac_lightning", "ac_full", "ac_selective"):
            assert result[tag]["losses"] == eager["losses"], tag  # bit-identical
            assert result[tag]["block_calls"] == 2 * BLOCKS * STEPS, tag  # forward + recomputation
        # Full recomputes each Block's first matmul (its output is what tanh's backward needs; the
        # recomputation stops there); selective keeps matmul outputs, so recomputes none.
        assert result["ac_full"]["matmuls_first_step"] == eager["matmuls_first_step"] + BLOCKS
        assert result["ac_lightning"]["matmuls_first_step"] == result["ac_full"]["matmuls_first_step"]
        assert result["ac_selective"]["matmuls_first_step"] == eager["matmuls_first_step"]


def test_regional_compile_equals_eager(job: tuple[list[dict[str, Any]], str]) -> None:
    ranks, output = job
    for result in ranks:
        for tag in ("compiled", "compiled_ac"):
            compiled = result[tag]
            assert _max_diff(compiled["losses"], result["eager"]["losses"]) < 1e-4, tag
            assert compiled["forward_replaced"] and compiled["graphs"] >= 1, tag
            assert compiled["block_calls"] == 0, tag  # every call ran the graph, none fell back to eager
    assert output.count("torch.compile under strategy='model_parallel'") == 2, output  # once per compiled fit


@pytest.mark.parametrize(
    ("tag", "option"),
    [("bad_ac", "activation_checkpointing_policy=full:Conv1d"), ("bad_compile", "compile_policy=")],
)
def test_a_policy_matching_nothing_is_one_clear_error(
    job: tuple[list[dict[str, Any]], str], tag: str, option: str
) -> None:
    ranks, _ = job
    errors = {result[tag]["error"] for result in ranks}
    assert len(errors) == 1, errors  # the same single error on every rank
    error = errors.pop()
    assert error.startswith("MisconfigurationError: ModelParallelStrategy("), error
    for fragment in (option, "matches no submodule of Net", "'FSDPBlock'", "Fix: name classes from that list"):
        assert fragment in error, error
