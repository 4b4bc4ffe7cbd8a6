"""The planner's trace of ``F.scaled_dot_product_attention``: what the fused kernels save, not ``L x L``.

On the meta device torch runs attention through its math path, which saves the whole attention
matrix; a real training step (flash attention on CPU, flash or memory-efficient attention on
GPUs) saves the query, key, value, output and the row-wise log-sum-exp. The trace stands in the
fused kernel's saves, so its bytes follow the sequence length linearly. Here the trace is held to
what the same model saves in a real CPU forward in this process (a ``saved_tensors_hooks`` count of
distinct storages, parameters excluded), at two lengths, and the context-parallel arithmetic to
its formula.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from phalanx.memory import MemoryRequest, activation_estimate
from phalanx.model_shapes import build_on_meta, summarize_model
from phalanx.testing.memory_probe import saved_for_backward

DIM, HEADS, BATCH = 64, 4, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, HEADS, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(a.transpose(1, 2).reshape(b, s, DIM))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _saved_in_a_real_forward(length: int) -> int:
    with saved_for_backward() as seen:
        output = Attention()(torch.randn(BATCH, length, DIM))
    seen[output.untyped_storage().data_ptr()] = output.untyped_storage().nbytes()  # the trace counts the output
    return sum(seen.values())


@pytest.mark.parametrize("length", [256, 2048])
def test_attention_is_traced_as_the_fused_kernel_a_real_step_runs(length: int) -> None:
    summary = summarize_model(build_on_meta(Attention), input_shape=(BATCH, length, DIM))
    assert summary.activation_bytes is not None
    real = _saved_in_a_real_forward(length)
    assert abs(summary.activation_bytes - real) <= 0.10 * real, (summary.activation_bytes, real)
    # q, k, v (one qkv output) + the output + the log-sum-exp, per block
    per_block = 4 * BATCH * length * (3 * DIM + DIM) + 4 * BATCH * HEADS * length
    assert summary.attention_bytes == 2 * per_block
    # the math path's L x L matrix is gone: bytes grow linearly with the length
    assert summary.activation_bytes < 2 * 4 * BATCH * HEADS * length * length


def test_context_parallel_splits_all_but_attention() -> None:
    """Under cp, attention's saved tensors cover the whole sequence ((2cp + 1) / 2cp of it, for the
    causal load balancing's padded queries) plus the rank's local share (1 / cp); the rest divides
    by cp. (Held to measured bytes on 2 and 4 ranks by benchmarks/bench_cp_memory.py.)"""
    summary = summarize_model(build_on_meta(Attention), input_shape=(BATCH, 1024, DIM))
    traced, attention = summary.activation_bytes, summary.attention_bytes
    assert traced is not None and 0 < attention < traced
    request = MemoryRequest("model_parallel", "x:Y", {}, summary)
    assert activation_estimate(request, divisor=1, context_parallel=1) == traced
    for cp in (2, 4):
        expected = (traced - attention) / cp + attention * ((2 * cp + 1) / (2 * cp) + 1 / cp)
        got = activation_estimate(request, divisor=cp, context_parallel=cp)
        assert got is not None and abs(got - expected) <= 1, (cp, got, expected)
