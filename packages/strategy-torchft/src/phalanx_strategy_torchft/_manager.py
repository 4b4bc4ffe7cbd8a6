"""The torchft pieces of one replica group: its Manager, the gradient hook, the commit gate.

Kept apart from the strategy so that the step semantics read in one place:

* before each step the group asks the lighthouse for a quorum (``start_quorum``, synchronous: a
  group that is behind heals *before* its forward pass, so it contributes a real gradient);
* during backward DDP hands each gradient bucket to :func:`ft_comm_hook`: averaged inside the
  group (ranks of one group), then across the groups of the quorum through torchft;
* after backward the group asks whether the step commits (``should_commit``); only then does the
  optimizer step. A step commits when every group of the quorum reduced without error and the
  quorum holds at least ``min_replicas`` groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

__all__ = ["CommitGate", "clone_state", "ft_comm_hook", "state_size"]


def ft_comm_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average a gradient bucket over the ranks of this group, then over the groups of the quorum.

    ``state`` is ``(manager, group_size)``. torchft's all-reduce never raises: an error (a peer
    group died mid-reduce) is recorded in the manager and makes ``should_commit`` answer False, so
    this step is dropped everywhere and the bucket's content does not matter.
    """
    manager, group_size = state
    buffer = bucket.buffer()
    if group_size > 1:
        dist.all_reduce(buffer)
        buffer.div_(group_size)
    work = manager.allreduce(buffer)
    work.wait()
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


# DDP checks a hook's annotations by identity; with postponed annotations they would be strings.
ft_comm_hook.__annotations__ = {"state": Any, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


class CommitGate(Optimizer):
    """The optimizer as the precision steps it: runs the closure, steps only if the step commits.

    It forwards ``param_groups`` and ``state`` so that clipping and ``on_before_optimizer_step``
    see the real optimizer's parameters.
    """

    def __init__(self, optimizer: Optimizer, should_commit: Callable[[], bool]) -> None:  # no super(): a view
        self.optimizer = optimizer
        self._should_commit = should_commit
        self.committed = False

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """Forward + backward (the closure), then the quorum's verdict, then maybe the update."""
        result = closure() if closure is not None else None
        self.committed = self._should_commit()
        if self.committed:
            self.optimizer.step(**kwargs)
        return result

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)


def clone_state(value: Any) -> Any:
    """Deep-copy tensors (detached) inside nested dicts/lists: the state served to a healing peer
    must not change while it is read."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: clone_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clone_state(v) for v in value)
    return value


def state_size(values: Iterable[Any]) -> int:
    """Bytes of tensors in a nested state (reported in the heal record)."""
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            total += state_size(value.values())
        elif isinstance(value, (list, tuple)):
            total += state_size(value)
    return total
