"""What one DDP rank holds: a full replica, plus the reducer's gradient buckets.

``DistributedDataParallel`` copies every gradient into flat buckets for the all-reduce, so unless
``gradient_as_bucket_view=True`` the gradients exist twice (once in ``param.grad``, once in the
buckets). The buckets live in C++, which is why they are reported as ``other``.
"""

from __future__ import annotations

from phalanx.memory import MemoryEstimate, MemoryRequest, replicated_estimate

__all__ = ["TARGET", "estimate"]

TARGET = "phalanx_strategy_ddp.strategy:DDPStrategy"


def estimate(request: MemoryRequest) -> MemoryEstimate | None:
    """A replica per rank; gradient buckets as large as the gradients unless they are views."""
    if request.target != TARGET:
        return None
    as_view = bool(request.init_params.get("gradient_as_bucket_view", False))
    buckets = 0 if as_view else request.model.trainable_numel * request.bytes.gradients
    note = "gradients are views of the buckets" if as_view else "other: DDP gradient buckets (a 2nd copy)"
    return replicated_estimate(request, layout=f"replicated x{request.world_size}", other=buckets, notes=(note,))
