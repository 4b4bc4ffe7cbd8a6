"""Helpers for ParallelStrategy: reduce-op parsing and DistributedSampler injection.

Kept apart from the strategy class so that plugins (FSDP, DeepSpeed) can reuse them and so the
strategy file stays about the strategy.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler

from phalanx.errors import MisconfigurationError

__all__ = ["all_gather", "inject_distributed_sampler", "resolve_reduce_op"]

_OPS = ("mean", "avg", "sum", "max", "min", "product")
#: DataLoader arguments copied verbatim when the loader is rebuilt around a new sampler.
_LOADER_ARGS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


class _AllGather(torch.autograd.Function):
    """all_gather whose backward sends each rank the gradient of its own slice, summed over ranks."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, tensor, group=group)
        return torch.stack(gathered)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad_output.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def all_gather(tensor: torch.Tensor, group: Any, *, sync_grads: bool) -> torch.Tensor:
    """Gather ``tensor`` from every rank into shape ``(world_size, *tensor.shape)``.

    With ``sync_grads`` the result is differentiable: contrastive losses computed on the gathered
    tensor send gradients back to every rank's own input.
    """
    tensor = tensor.contiguous()
    if sync_grads:
        return _AllGather.apply(tensor, group)  # type: ignore[no-any-return]
    with torch.no_grad():
        gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, tensor, group=group)
    return torch.stack(gathered)


def resolve_reduce_op(reduce_op: Any) -> tuple[Any, bool]:
    """Map a reduce op to ``(ReduceOp, divide_by_world_size)``.

    "mean" is a SUM followed by a division because gloo has no AVG; doing it the same way on every
    backend keeps results identical across them.
    """
    if reduce_op is None:
        return dist.ReduceOp.SUM, True
    if isinstance(reduce_op, str):
        name = reduce_op.lower()
        if name in ("mean", "avg"):
            return dist.ReduceOp.SUM, True
        if name in _OPS:
            return getattr(dist.ReduceOp, name.upper()), False
        msg = f"reduce_op={reduce_op!r} is not supported; use one of {', '.join(_OPS)} or a torch.distributed.ReduceOp."
        raise MisconfigurationError(msg)
    if reduce_op == dist.ReduceOp.AVG:
        return dist.ReduceOp.SUM, True
    return reduce_op, False


def inject_distributed_sampler(dataloader: Any, shuffle: bool | None, *, num_replicas: int, rank: int) -> Any:
    """Rebuild ``dataloader`` so that rank ``rank`` of ``num_replicas`` reads only its shard."""
    if not isinstance(dataloader, DataLoader) or isinstance(dataloader.dataset, IterableDataset):
        return dataloader
    if isinstance(dataloader.sampler, DistributedSampler):
        return dataloader
    if shuffle is None:
        shuffle = isinstance(dataloader.sampler, RandomSampler)
    # seed=0 like a hand-written DDP loop, so phalanx and plain torch shard identically.
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataloader.dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=0
    )
    return replace_sampler(dataloader, sampler)


def replace_sampler(dataloader: DataLoader[Any], sampler: Any) -> DataLoader[Any]:
    """``dataloader`` rebuilt with ``sampler`` choosing the order (everything else as it was).

    Raises:
        MisconfigurationError: A custom batch sampler without ``.sampler``, or a DataLoader subclass
            whose ``__init__`` does not take DataLoader's arguments.
    """
    kwargs: dict[str, Any] = {name: getattr(dataloader, name) for name in _LOADER_ARGS if hasattr(dataloader, name)}
    if dataloader.num_workers > 0:
        kwargs["prefetch_factor"] = dataloader.prefetch_factor
    else:
        kwargs.pop("persistent_workers", None)
    batch_sampler = dataloader.batch_sampler
    if batch_sampler is None:
        kwargs.update(batch_size=None, sampler=sampler)
    elif type(batch_sampler) is BatchSampler:
        kwargs.update(batch_size=batch_sampler.batch_size, drop_last=batch_sampler.drop_last, sampler=sampler)
    elif hasattr(batch_sampler, "sampler"):
        custom = copy.copy(batch_sampler)
        custom.sampler = sampler
        kwargs["batch_sampler"] = custom
    else:
        msg = (
            f"Cannot shard a DataLoader whose batch_sampler is a {type(batch_sampler).__name__} without a "
            "`.sampler` attribute: phalanx does not know where to put the DistributedSampler. Fix: give "
            "it a `sampler` attribute, shard the data yourself and pass Trainer(use_distributed_sampler=False)."
        )
        raise MisconfigurationError(msg)
    try:
        return type(dataloader)(dataloader.dataset, **kwargs)
    except TypeError as err:
        msg = (
            f"Cannot rebuild {type(dataloader).__name__} with a {type(sampler).__name__} ({err}); its __init__ does not "
            "accept DataLoader's arguments. Fix: use a plain DataLoader, or shard the data yourself and pass "
            "Trainer(use_distributed_sampler=False)."
        )
        raise MisconfigurationError(msg) from err
