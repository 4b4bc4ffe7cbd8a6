"""A tiny MoE network, its data and the one-process reference, shared by ``train_moe.py`` and the tests.

The expert-parallel runs and the reference build the network from the same seed and read the
same global batches, so every difference comes from sharding the experts and moving tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx_strategy_model_parallel import MoE, StackedExperts

DIM, HIDDEN, EXPERTS, TOP_K, SEQ = 8, 8, 4, 2, 4
SAMPLES, GLOBAL_BATCH, LR, AUX_COEF, MAX_NORM = 32, 8, 0.1, 0.1, 1.0


class MoENet(nn.Module):
    """Causal self-attention (SDPA, so context parallel can split sequences) -> residual MoE -> head; ~800 parameters."""

    def __init__(self, num_experts: int = EXPERTS, stacked: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        experts = None
        if stacked:  # the nn.ModuleList recipe: identical FFN modules stacked
            ffns = [
                nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM)) for _ in range(num_experts)
            ]
            experts = StackedExperts.from_modules(ffns)
        self.moe = MoE(DIM, HIDDEN, num_experts, TOP_K, experts=experts)
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        h = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(h + self.moe(h))


def loss_fn(net: MoENet, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MSE plus the load-balancing loss of the forward that produced ``output``."""
    return F.mse_loss(output, target) + AUX_COEF * net.moe.aux_loss


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, SEQ, DIM, generator=generator)
    return TensorDataset(x, torch.randn(SAMPLES, SEQ, 1, generator=generator))


def loader(dp_size: int) -> DataLoader:
    """Batches of GLOBAL_BATCH / dp (the Trainer adds the DistributedSampler over data-parallel ranks)."""
    return DataLoader(dataset(), batch_size=GLOBAL_BATCH // dp_size, shuffle=False)


def single_process(epochs: int, stacked: bool = False) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """The whole network on one process, global batches, gradients clipped to MAX_NORM: per-step
    losses, per-step gradient norms (before clipping) and final weights."""
    net = MoENet(stacked=stacked)
    opt = make_optimizer(net.parameters())
    losses, norms = [], []
    for _ in range(epochs):
        for x, y in loader(1):
            loss = loss_fn(net, net(x), y)
            loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), MAX_NORM)))
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
    return losses, norms, {k: v.detach().clone() for k, v in net.state_dict().items()}
