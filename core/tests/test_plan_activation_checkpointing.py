"""The planner's activation estimate under activation checkpointing, traced on the meta device.

A stack of MLP blocks is traced once (nothing allocated); the per-block record (input bytes,
bytes saved inside) must add up with the whole trace, and full checkpointing must keep only the
block inputs plus one block's saved tensors while it is recomputed.
"""

from __future__ import annotations

import torch
from torch import nn

from phalanx.memory import MemoryRequest, activation_estimate, checkpointing_mode
from phalanx.model_shapes import build_on_meta, summarize_model
from phalanx.utilities.activation_checkpointing import ActivationCheckpointing

WIDTH, DEPTH, BATCH, SEQ = 64, 4, 2, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _request(policy: object = None) -> MemoryRequest:
    summary = summarize_model(build_on_meta(Stack), input_shape=(BATCH, SEQ, WIDTH))
    params = {} if policy is None else {"activation_checkpointing_policy": policy}
    return MemoryRequest("fsdp", "x:Y", params, summary)


def test_blocks_are_traced_one_by_one() -> None:
    summary = _request().model
    assert summary.activation_bytes is not None
    assert len(summary.block_activations) == DEPTH
    element = 4 * BATCH * SEQ
    for given, inside in summary.block_activations:
        assert given == element * WIDTH  # the block's input
        # up's input, up's output (gelu's input), gelu's output (down's input): 1 + 4 + 4 widths
        assert inside == element * 9 * WIDTH
    assert sum(inside for _, inside in summary.block_activations) < summary.activation_bytes


def test_full_checkpointing_keeps_block_inputs_and_one_recompute_with_its_gradients() -> None:
    plain = _request()
    full = _request({Block})
    traced, blocks = plain.model.activation_bytes, plain.model.block_activations
    assert traced is not None
    inside = sum(saved for _, saved in blocks)
    # the recomputed block's saved tensors, and their gradients beside them in that block's backward
    expected = traced - inside + sum(given for given, _ in blocks) + 2 * max(saved for _, saved in blocks)
    assert checkpointing_mode(full) == "full"
    assert activation_estimate(full) == expected
    # four blocks' saved tensors against four inputs and one block's saved tensors and gradients
    assert activation_estimate(full) < 0.65 * activation_estimate(plain)  # type: ignore[operator]
    assert activation_estimate(_request(ActivationCheckpointing({Block}, mode="full"))) == expected


def test_selective_is_estimated_as_no_checkpointing() -> None:
    selective = _request(ActivationCheckpointing({Block}, mode="selective"))
    assert checkpointing_mode(selective) == "selective"
    assert activation_estimate(selective) == activation_estimate(_request())
    assert checkpointing_mode(_request()) is None
