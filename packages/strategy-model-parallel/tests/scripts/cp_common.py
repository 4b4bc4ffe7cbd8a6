"""A tiny causal transformer, its data and the one-process reference for the context-parallel tests.

The model uses ``F.scaled_dot_product_attention(is_causal=True)`` and learned positions read
through ``context_parallel_positions``, so it runs unchanged in one plain process on whole
sequences and under the strategy on split ones. Targets are shifted in the dataset, before the
strategy splits the sequences.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx_strategy_model_parallel import context_parallel_positions

VOCAB, DIM, HEADS, SEQ, SAMPLES, GLOBAL_BATCH, LR = 16, 16, 2, 8, 16, 4, 0.1
HEAD_DIM = DIM // HEADS


class Block(nn.Module):
    """Pre-norm attention + MLP; heads per rank follow the tensor-parallel split of ``qkv``.

    ``attention``: ``"sdpa"`` (causal ``F.scaled_dot_product_attention``), ``"manual"`` (softmax
    by hand: context parallel cannot split it) or ``"mha"`` (``nn.MultiheadAttention``, which calls
    SDPA from inside torch's own functional code; not causal).
    """

    def __init__(self, attention: str = "sdpa") -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM)
        if attention == "mha":
            self.mha = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        else:
            self.q = nn.Linear(DIM, DIM)
            self.k = nn.Linear(DIM, DIM)
            self.v = nn.Linear(DIM, DIM)
            self.out = nn.Linear(DIM, DIM)
        self.norm2 = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)
        self.attention = attention

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        return x.view(batch, seq, width // HEAD_DIM, HEAD_DIM).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        if self.attention == "mha":
            x = x + self.mha(h, h, h, need_weights=False)[0]
            return x + self.down(F.gelu(self.up(self.norm2(x))))
        q, k, v = self._heads(self.q(h)), self._heads(self.k(h)), self._heads(self.v(h))
        if self.attention == "manual":  # softmax attention by hand: context parallel cannot split it
            scores = (q @ k.transpose(-1, -2)) / HEAD_DIM**0.5
            mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
            a = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        batch, _, seq, _ = a.shape
        x = x + self.out(a.transpose(1, 2).reshape(batch, seq, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self, attention: str = "sdpa") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList([Block(attention), Block(attention)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos(context_parallel_positions(tokens.shape[1], tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def tp_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    cols = {name: ColwiseParallel() for name in ("q", "k", "v", "up")}
    return cols | {"out": RowwiseParallel(), "down": RowwiseParallel()}


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over this rank's tokens; FSDP's mean over dp x cp ranks makes it the global mean."""
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def dataset(seq: int = SEQ) -> TensorDataset:
    tokens = torch.randint(0, VOCAB, (SAMPLES, seq + 1), generator=torch.Generator().manual_seed(7))
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def loader(dp_size: int, seq: int = SEQ) -> DataLoader:
    return DataLoader(dataset(seq), batch_size=GLOBAL_BATCH // dp_size, shuffle=False)


def single_process(epochs: int, attention: str = "sdpa") -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain PyTorch, whole sequences, global batches: per-step losses and final weights."""
    net = TinyLM(attention)
    opt = make_optimizer(net.parameters())
    losses = []
    for _ in range(epochs):
        for tokens, targets in loader(1):
            loss = loss_fn(net(tokens), targets)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in net.state_dict().items()}
