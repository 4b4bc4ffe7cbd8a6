"""Gradient-norm clipping over parameters that live on different meshes.

``torch.nn.utils.clip_grad_norm_`` stacks the per-tensor norms, which DTensor refuses when the
gradients are on different meshes: expert weights (``expert_data_parallel`` x ``expert_parallel``)
beside dense weights (``data_parallel``); and reducing a norm over a mesh whose first dim is a
flattened one (experts under context parallel) fails in DTensor's redistribute. Here each
gradient's local sum of squares is summed over the mesh dims it is sharded on (one all-reduce per
dim and placement group, the ranks that hold copies are not counted twice), the sums are added as
plain numbers, and every gradient is scaled in place by the same factor: one process's
``clip_grad_norm_``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """Scale the gradients so that their total 2-norm is at most ``max_norm``; call it on every rank.

    Use it in ``Module.on_before_optimizer_step`` under ``expert_parallel_size > 1`` (where the
    Trainer's ``gradient_clip_val`` is refused): ``clip_grad_norm_(self.parameters(), 1.0)``.

    Args:
        parameters: Parameters whose ``.grad`` are clipped (those without one are skipped).
        max_norm: The largest total norm kept.
        eps: Added to the norm before dividing, as torch does.

    Returns:
        The total norm before clipping (a plain tensor, equal on every rank).
    """
    groups: dict[Any, list[torch.Tensor]] = {}  # (mesh, placements), or None for plain tensors
    for param in parameters:
        grad = param.grad
        if grad is not None:
            where = (grad.device_mesh, tuple(grad.placements)) if isinstance(grad, DTensor) else None
            groups.setdefault(where, []).append(grad)
    total_square = torch.zeros((), dtype=torch.float64)
    for key, grads in groups.items():
        local = torch.stack([_local(g).detach().double().square().sum() for g in grads]).sum()
        if key is not None:
            mesh, placements = key
            for dim, placement in enumerate(placements):
                if not placement.is_replicate():  # sharded (strided too) or partial: ranks hold different parts
                    dist.all_reduce(local, group=mesh.get_group(dim))
        total_square += local.cpu()
    total = total_square.sqrt().float()
    coefficient = min(1.0, max_norm / (float(total) + eps))
    if coefficient < 1.0:
        for grads in groups.values():
            for grad in grads:
                grad.mul_(coefficient)
    return total


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
