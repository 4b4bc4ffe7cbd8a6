"""Context parallel and HSDP train exactly like plain PyTorch on whole sequences.

Each run's per-step loss (mean over the dp x cp ranks) and final gathered weights are compared
with one plain process training ``TinyLM`` on whole sequences and global batches, computed here;
HSDP is also compared step by step with plain ``fully_shard`` over all four ranks.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from cp_common import single_process
from mp_testing import read_ranks

pytestmark = pytest.mark.timeout(400)

LOSS_ATOL, WEIGHT_ATOL = 1e-5, 1e-5
_reference = functools.cache(single_process)  # the same plain run serves every comparison


def _compare(out: Path, tag: str, world: int, epochs: int = 2, attention: str = "sdpa") -> list[dict]:
    results = read_ranks(out, tag, world)
    ref_losses, ref_weights = _reference(epochs, attention)
    for result in results:
        assert result["global_step"] == len(ref_losses)
        worst = max(abs(a - b) for a, b in zip(result["global_losses"], ref_losses, strict=True))
        assert worst <= LOSS_ATOL, f"{tag}: per-step loss differs from one process by {worst:.3g}"
    weights = torch.load(out / f"{tag}_weights.pt", weights_only=True)
    assert set(weights) == {f"net.{k}" for k in ref_weights}
    worst = max(float((weights[f"net.{k}"] - v).abs().max()) for k, v in ref_weights.items())
    assert worst <= WEIGHT_ATOL, f"{tag}: final weights differ from one process by {worst:.3g}"
    return results


def test_context_parallel_2_matches_one_process_on_whole_sequences(context_parallel_2: Path) -> None:
    results = _compare(context_parallel_2, "cp2", 2)
    assert results[0]["mesh_dims"] == ["data_parallel_context_parallel"]  # FSDP reduced over cp
    assert results[0]["seq_len_seen"] == 4
    # the two cp ranks saw different tokens of the same samples: different local losses
    assert results[0]["losses"] != results[1]["losses"]


def test_context_parallel_splits_the_attention_inside_nn_multihead_attention(context_parallel_2: Path) -> None:
    """nn.MultiheadAttention calls SDPA from torch's own functional code (not causal here): under cp 2
    it attends over the whole sequence and trains like one process."""
    results = _compare(context_parallel_2, "cp2mha", 2, attention="mha")
    assert results[0]["seq_len_seen"] == 4
    assert results[0]["losses"] != results[1]["losses"]


@pytest.mark.parametrize(("tag", "epochs"), [("dp2cp2", 2), ("tp2cp2", 1)])
def test_context_parallel_with_data_and_tensor_parallel(context_parallel_4: Path, tag: str, epochs: int) -> None:
    results = _compare(context_parallel_4, tag, 4, epochs)
    coords = [
        (r["coords"]["data_parallel"], r["coords"]["context_parallel"], r["coords"]["tensor_parallel"]) for r in results
    ]
    assert len(set(coords)) == 4
    if tag == "tp2cp2":
        assert results[0]["all_mesh_dims"] == [
            "data_parallel_context_parallel",
            "data_parallel_context_parallel/tensor_parallel",
        ]


def test_hsdp_2x2_matches_plain_fsdp_and_one_process(context_parallel_4: Path) -> None:
    results = _compare(context_parallel_4, "hsdp", 4)
    for result in results:
        assert result["mesh_dims"] == ["data_parallel_replicate", "data_parallel_shard"]
        assert result["placements"] == ["R", "S(0)"]  # hybrid: replicated x sharded
        worst = max(abs(a - b) for a, b in zip(result["global_losses"], result["reference_losses"], strict=True))
        assert worst <= LOSS_ATOL, f"HSDP per-step loss differs from plain FSDP by {worst:.3g}"
    assert sorted(r["coords"]["data_parallel"] for r in results) == [0, 1, 2, 3]


def test_hsdp_times_context_parallel(context_parallel_4: Path) -> None:
    results = _compare(context_parallel_4, "hsdpcp", 4, epochs=1)
    assert results[0]["mesh_dims"] == ["data_parallel_replicate", "data_parallel_shard_context_parallel"]
    assert results[0]["placements"] == ["R", "S(0)"]


@pytest.mark.parametrize(
    ("tag", "fragments"),
    [
        ("nosdpa", ["context_parallel_size=2", "called no F.scaled_dot_product_attention", "Fix:"]),
        ("wrongmesh", ["would not be averaged over the context-parallel ranks", "fsdp_mesh", "Fix:"]),
    ],
)
def test_context_parallel_bad_models_are_refused_on_every_rank(
    context_parallel_2: Path, tag: str, fragments: list[str]
) -> None:
    for result in read_ranks(context_parallel_2, tag, 2):
        assert result["error"].startswith("MisconfigurationError"), result["error"]
        for fragment in fragments:
            assert fragment in result["error"], result["error"]
        assert result["steps_done"] <= 1  # refused at the first step (nosdpa) or before it (wrongmesh)
    assert not (context_parallel_2 / f"{tag}_weights.pt").exists()
