"""``AttentionOverride`` sees every attention call: direct ones, and the one inside nn.MultiheadAttention.

Each override here records its calls and computes with torch's own kernel, so the outputs must
equal a plain call's; on exit torch's name is back, also after nested overrides.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from phalanx.utilities.attention import AttentionOverride, scaled_dot_product_attention


class Recording(AttentionOverride):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def attend(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        assert self.attending
        self.shapes.append(tuple(args[0].shape))
        return scaled_dot_product_attention(*args, **kwargs)


def test_direct_and_multihead_attention_calls_are_routed_and_computed_by_torch() -> None:
    q = torch.randn(2, 4, 8, 16)
    mha = nn.MultiheadAttention(64, 4, batch_first=True)
    x = torch.randn(2, 8, 64)
    plain_direct = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    plain_mha = mha(x, x, x, need_weights=False)[0]
    with Recording() as override:
        direct = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        inside = mha(x, x, x, need_weights=False)[0]
    assert override.shapes == [(2, 4, 8, 16), (2, 4, 8, 16)]
    assert torch.equal(direct, plain_direct) and torch.equal(inside, plain_mha)
    assert not override.attending


def test_nested_overrides_compose_and_restore_torchs_name_in_order() -> None:
    """The inner override sees the call; the attention it computes is seen by the outer one."""
    q = torch.randn(1, 2, 4, 8)
    with Recording() as outer:
        with Recording() as inner:
            F.scaled_dot_product_attention(q, q, q)
        assert F.scaled_dot_product_attention == outer._route
        F.scaled_dot_product_attention(q, q, q)
    assert len(inner.shapes) == 1 and len(outer.shapes) == 2
    assert F.scaled_dot_product_attention is scaled_dot_product_attention
