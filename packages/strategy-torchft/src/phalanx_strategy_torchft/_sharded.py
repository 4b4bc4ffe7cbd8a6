"""The sharded pieces of ``ft_hsdp``: the cross-group gradient average and the state a peer heals from.

With FSDP2 inside a replica group, rank ``r`` of every group holds the same shard ``r`` of every
parameter, gradient and optimizer state (the groups have equal size, and ``fully_shard`` splits
along dim 0 the same way in each). So the replicate dimension is "rank ``r`` of every group":

* after FSDP2's reduce-scatter has averaged a gradient inside the group, torchft averages the
  local shard over the groups of the quorum (its process group pairs the same ranks of each group);
* a healing rank receives the local shards of the same rank of a live group, and wraps them back
  into DTensors laid out like its own parameters.

Local tensors travel, not DTensors: a DTensor names its device mesh, which belongs to the sending
group's process group and means nothing in the receiving one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim import Optimizer

__all__ = ["allreduce_shards", "as_dtensors", "full_state", "restore_optimizer_layout", "shard_full_state", "to_local"]


def to_local(value: Any) -> Any:
    """Replace every DTensor in a nested state by its local shard (other values unchanged)."""
    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, dict):
        return {k: to_local(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_local(v) for v in value)
    return value


def full_state(value: Any) -> Any:
    """Replace every DTensor in a nested state by the full tensor (a collective over the group):
    a checkpoint holds plain full tensors, readable by any strategy and by ``torch.load``."""
    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: full_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(full_state(v) for v in value)
    return value


def _shard_of(full: torch.Tensor, target: DTensor) -> DTensor:
    """This rank's shard of a full tensor every rank holds (no communication)."""
    return distribute_tensor(full.to(target.device), target.device_mesh, target.placements, src_data_rank=None)


def shard_full_state(full: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """A full model state (from a checkpoint) as DTensors laid out like this rank's ``own`` state dict."""
    return {
        key: _shard_of(value, own[key])
        if isinstance(own.get(key), DTensor) and isinstance(value, torch.Tensor) and not isinstance(value, DTensor)
        else value
        for key, value in full.items()
    }


def _like(local: torch.Tensor, target: DTensor) -> DTensor:
    return DTensor.from_local(
        local.to(target.device),
        target.device_mesh,
        target.placements,
        run_check=False,
        shape=target.shape,
        stride=target.stride(),
    )


def as_dtensors(received: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """A received model state (local shards) as DTensors laid out like this rank's ``own`` state dict.

    Raises:
        ValueError: A received shard's shape differs from this rank's: the groups are not of equal
            size (or not the same model), so the shards do not correspond.
    """
    result: dict[str, Any] = {}
    for key, value in received.items():
        target = own.get(key)
        if isinstance(target, DTensor) and isinstance(value, torch.Tensor):
            if value.shape != target.to_local().shape:
                msg = (
                    f"ft_hsdp received a shard of {key!r} of shape {tuple(value.shape)} but this rank holds "
                    f"{tuple(target.to_local().shape)}: every replica group must have the same number of ranks "
                    "and the same model. Fix: start every group with the same devices x num_nodes."
                )
                raise ValueError(msg)
            value = _like(value, target)
        result[key] = value
    return result


def restore_optimizer_layout(optimizer: Optimizer) -> None:
    """After loading plain tensors into ``optimizer``, make each state tensor of a DTensor parameter
    a DTensor again, so the update runs on DTensors: one of the parameter's local shape (a healing
    peer's shard) is wrapped as it is, one of its full shape (a checkpoint) is split. Adam's 0-dim
    step stays a plain tensor."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, DTensor):
                continue
            local_shape = param.to_local().shape
            state = optimizer.state.get(param, {})
            for key, value in list(state.items()):
                if isinstance(value, DTensor) or not isinstance(value, torch.Tensor):
                    continue
                if value.dim() == 0:
                    continue
                if value.shape == param.shape:
                    state[key] = _shard_of(value, param)
                elif value.shape == local_shape:
                    state[key] = _like(value, param)


def _local_grads(parameters: Iterable[nn.Parameter]) -> list[torch.Tensor]:
    grads = []
    for param in parameters:
        grad = param.grad
        if grad is None:
            continue
        grads.append(grad.to_local() if isinstance(grad, DTensor) else grad)
    return grads


def allreduce_shards(manager: Any, parameters: Iterable[nn.Parameter]) -> None:
    """Average this rank's gradient shards over the quorum's groups, in one torchft all-reduce.

    torchft's all-reduce never raises: an error (a peer group died) is recorded in the manager,
    ``should_commit`` then answers False and the step is dropped, so the gradients' content after a
    failed reduce does not matter.
    """
    grads = _local_grads(parameters)
    if not grads:
        return
    with torch.no_grad():
        flat = torch.cat([g.reshape(-1) for g in grads])
        manager.allreduce(flat).wait()
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
