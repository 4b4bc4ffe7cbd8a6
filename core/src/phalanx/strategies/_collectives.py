"""The collective operations every strategy provides.

The Trainer, the logger (``sync_dist=True``) and callbacks call these unconditionally; a
single-process strategy answers them trivially, a parallel one talks to its process group. Having
them on every strategy keeps ``if distributed:`` branches out of user code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, TypeVar

import torch

__all__ = ["StrategyCollectives", "TBroadcast"]

TBroadcast = TypeVar("TBroadcast")


class StrategyCollectives(ABC):
    """Abstract collectives mixed into :class:`~phalanx.strategies.strategy.Strategy`."""

    @property
    @abstractmethod
    def root_device(self) -> torch.device:
        """See ``Strategy.root_device``."""

    @property
    def world_size(self) -> int:
        """Number of processes taking part; 1 unless a parallel strategy says otherwise."""
        return 1

    @abstractmethod
    def all_gather(
        self,
        tensor: torch.Tensor,
        group: Any | None = None,
        sync_grads: bool = False,
    ) -> torch.Tensor:
        """Gather ``tensor`` from every process (stacked on a new first dimension when parallel)."""

    @abstractmethod
    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any | None = "mean") -> Any:
        """Reduce ``tensor`` over processes with ``reduce_op`` (``"mean"``, ``"sum"`` or a ReduceOp)."""

    @abstractmethod
    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Send ``obj`` from rank ``src`` to every process."""

    @abstractmethod
    def barrier(self, name: str | None = None) -> None:
        """Wait until every process reaches this point."""

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Agree on a boolean across processes: all of them (``all=True``) or any said yes.

        The parameter keeps Lightning's name ``all`` so callers' keyword arguments port unchanged.
        """
        tensor = torch.tensor(int(decision), device=self.root_device)
        total = self.reduce(tensor, reduce_op="sum")
        count = int(total.item()) if isinstance(total, torch.Tensor) else int(total)
        return count == self.world_size if all else count > 0
