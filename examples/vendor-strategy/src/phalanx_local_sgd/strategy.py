"""Local SGD: ranks train independently and average their parameters every ``sync_every`` steps.

One all-reduce per ``sync_every`` optimizer steps instead of one per backward is the point on slow
links. With ``sync_every=1`` and SGD it is DDP's update: the mean of the ranks' stepped parameters
equals the parameters stepped with the mean gradient (momentum is linear, so it too).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from phalanx.errors import MisconfigurationError
from phalanx.strategies import ParallelStrategy

__all__ = ["LocalSGDStrategy"]


class LocalSGDStrategy(ParallelStrategy):
    """ParallelStrategy launches, shards the data and starts all replicas equal; this adds the average.

    Args:
        sync_every: Average after every ``sync_every``-th optimizer step (1: after every step).
        **kwargs: ParallelStrategy's arguments (``start_method``, ``process_group_backend``, ...).
    """

    def __init__(self, accelerator: Any = None, *, sync_every: int = 4, **kwargs: Any) -> None:
        super().__init__(accelerator, **kwargs)
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            msg = f"LocalSGDStrategy(sync_every={sync_every!r}): need an int >= 1 (1 averages after every step), e.g. 4."
            raise MisconfigurationError(msg)
        self.sync_every = sync_every

    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        """Step locally, then average when the Trainer's step count (kept across resumes) is due."""
        result = super().optimizer_step(optimizer, closure, model, **kwargs)
        if (self.require_module().global_step + 1) % self.sync_every == 0:
            self.average()
        return result

    @torch.no_grad()
    def average(self) -> None:
        """All-reduce the parameters and the optimizers' float state to their mean (gloo has no AVG).

        With the state (momentum, Adam's moments) averaged too, every rank leaves a sync with the
        same state, so rank 0's checkpoint of a sync step resumes exactly.
        """
        state = [v for opt in self.optimizers for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        tensors = [*self.require_module().parameters(), *(t for t in state if t.is_floating_point())]
        for tensor, work in [(t, dist.all_reduce(t, async_op=True)) for t in tensors]:
            work.wait()
            tensor.div_(self.world_size)
