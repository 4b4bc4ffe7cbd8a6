"""Model factories for ``phalanx plan``: a 1.3B-parameter GPT-style transformer and a small one.

``phalanx plan examples/plan_models.py:build_1_3b --devices 8 --device-memory 24GiB`` builds the
model on the meta device (nothing allocated) and prints what each strategy would hold per rank.
The configuration is GPT-3 XL's: 24 layers, width 2048, 16 heads, 50257-token vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Config:
    """Transformer shape; the defaults are the 1.3B configuration."""

    vocab: int = 50257
    width: int = 2048
    layers: int = 24
    heads: int = 16
    context: int = 2048


class Block(nn.Module):
    """Pre-norm attention + 4x MLP, the unit FSDP-style strategies gather one at a time."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.width)
        self.attn = nn.MultiheadAttention(config.width, config.heads, batch_first=True)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(nn.Linear(config.width, 4 * config.width), nn.GELU(), nn.Linear(4 * config.width, config.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False, is_causal=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """Token + position embeddings, blocks, final norm, head tied to the token embedding."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[-1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_1_3b() -> nn.Module:
    """The 1.3B-parameter configuration."""
    return Transformer(Config())


def build_small() -> nn.Module:
    """A 4-layer, width-256 transformer (about 16M parameters) to try the command quickly."""
    return Transformer(Config(vocab=32000, width=256, layers=4, heads=4, context=512))


def build_70b() -> nn.Module:
    """A 70B-class shape (80 layers, width 8192) to show that planning never allocates weights."""
    return Transformer(Config(vocab=32000, width=8192, layers=80, heads=64, context=4096))


build = build_1_3b
