"""Gradient norms per parameter and overall, ready for ``self.log_dict``.

Typical use, in a Module::

    def on_before_optimizer_step(self, optimizer):
        self.log_dict(grad_norm(self, norm_type=2))

Keys are Lightning's (``grad_2.0_norm/layer.weight``, ``grad_2.0_norm_total``) so dashboards and
callbacks that read them keep working after a port.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["grad_norm"]


def grad_norm(module: torch.nn.Module, norm_type: float | int | str, group_separator: str = "/") -> dict[str, Tensor]:
    """The ``norm_type``-norm of each parameter's gradient, and of all gradients as one vector.

    Parameters without a gradient are left out; with none at all the result is empty (no total).

    Args:
        module: The module whose ``named_parameters()`` are inspected.
        norm_type: The p of the p-norm: a positive number, or ``"inf"`` for the largest magnitude.
        group_separator: Put between ``grad_{p}_norm`` and each parameter name; loggers such as
            TensorBoard group metrics by it.

    Returns:
        ``{"grad_{p}_norm{sep}{name}": norm, ..., "grad_{p}_norm_total": total}``, with ``p`` the
        float value of ``norm_type`` (``2.0``, ``inf``) and each value a 0-d tensor on its
        gradient's device (the total on the first gradient's device).

    Raises:
        ValueError: ``norm_type`` is not a positive number or ``"inf"``.
    """
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        p = math.nan
    if not p > 0:  # also rejects NaN
        msg = f"norm_type={norm_type!r} is not supported; pass a positive number (1, 2, ...) or 'inf' for the max norm"
        raise ValueError(msg)
    norms = {
        f"grad_{p}_norm{group_separator}{name}": torch.linalg.vector_norm(param.grad.detach(), ord=p)
        for name, param in module.named_parameters()
        if param.grad is not None
    }
    if norms:
        first = next(iter(norms.values()))
        # The p-norm of all gradients concatenated equals the p-norm of their p-norms.
        stacked = torch.stack([norm.to(first.device) for norm in norms.values()])
        norms[f"grad_{p}_norm_total"] = torch.linalg.vector_norm(stacked, ord=p)
    return norms
