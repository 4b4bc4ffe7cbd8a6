"""Collectives over ``torch.distributed`` for ParallelStrategy.

Each degrades to the identity before the process group exists (or after it is gone), so code that
reduces a logged value or waits at a barrier runs unchanged in a single process. Kept apart from
``parallel.py`` so the strategy file stays about launching and lifecycle.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from phalanx.strategies._agreement import check_agreement
from phalanx.strategies._collectives import StrategyCollectives, TBroadcast
from phalanx.strategies._distributed import all_gather as _all_gather
from phalanx.strategies._distributed import resolve_reduce_op

__all__ = ["ParallelCollectives"]


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


class ParallelCollectives(StrategyCollectives):
    """``all_gather`` / ``reduce`` / ``broadcast`` / ``barrier`` mixed into ParallelStrategy.

    With ``PHALANX_DISTRIBUTED_DEBUG=1`` each one first checks that every rank is about to run the
    same one (:mod:`phalanx.strategies._agreement`); ParallelStrategy sets the two fields below
    when it creates the process group.
    """

    #: Whether collectives are checked for agreement first (``PHALANX_DISTRIBUTED_DEBUG``).
    _check_collectives: bool = False
    #: The small gloo group the check (and the timeout diagnosis) talks on.
    _check_in_group: Any = None

    def _agree(self, op: str, value: Any) -> None:
        if self._check_collectives and self._check_in_group is not None:
            check_agreement(op, value, group=self._check_in_group, rank=dist.get_rank(), world_size=dist.get_world_size())

    def all_gather(self, tensor: torch.Tensor, group: Any | None = None, sync_grads: bool = False) -> torch.Tensor:
        """Gather ``tensor`` from every rank into a tensor of shape ``(world_size, *tensor.shape)``.

        ``sync_grads=True`` uses the differentiable all_gather, so gradients flow back to every
        rank's input (contrastive losses need this).
        """
        if not _initialized():
            return tensor
        if group is None:  # the check runs over the world: a subgroup's collective is not checked
            self._agree("all_gather", tensor)
        return _all_gather(tensor, dist.group.WORLD if group is None else group, sync_grads=sync_grads)

    def reduce(
        self, tensor: torch.Tensor | Any, group: Any | None = None, reduce_op: Any | None = "mean"
    ) -> torch.Tensor | Any:
        """Reduce a tensor over ranks: "mean" (default), "sum", "max", "min" or a ``ReduceOp``.

        Returns a new tensor (the input is left untouched). Non-tensors pass through unchanged, so
        callers can reduce logged values without checking their type.
        """
        if not isinstance(tensor, torch.Tensor) or not _initialized():
            return tensor
        if group is None:
            self._agree(f"reduce({reduce_op})", tensor)
        group = dist.group.WORLD if group is None else group
        op, divide = resolve_reduce_op(reduce_op)
        result = tensor.detach().clone()
        if divide and not torch.is_floating_point(result):
            result = result.float()
        dist.all_reduce(result, op=op, group=group)
        if divide:
            result = result / dist.get_world_size(group)
        return result

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Agree on a boolean: every rank (``all=True``) or at least one rank said yes."""
        if not _initialized():
            return bool(decision)
        return super().reduce_boolean_decision(decision, all=all)

    def barrier(self, name: str | None = None) -> None:
        """Block until every rank arrives; a no-op before the process group exists."""
        del name
        if not _initialized():
            return
        self._agree("barrier", None)
        if dist.get_backend() == "nccl" and self.root_device.type == "cuda":
            dist.barrier(device_ids=[self.root_device.index])
        else:
            dist.barrier()

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Send any picklable object from rank ``src`` to every rank."""
        if not _initialized():
            return obj
        self._agree(f"broadcast(src={src})", obj)
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]
