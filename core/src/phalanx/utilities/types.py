"""Type aliases for annotating Module hooks, as ``lightning.pytorch.utilities.types`` names them.

Annotations are what ported code imports most from Lightning's utilities
(``def training_step(...) -> STEP_OUTPUT``, ``def configure_optimizers(self) -> OptimizerLRScheduler``),
so the same names live here under the same module path.

``LRSchedulerConfig`` is phalanx's own dataclass (:class:`phalanx.utilities.optim.LRSchedulerConfig`,
what the Trainer steps); unlike Lightning's, its ``reduce_on_plateau`` is derived from the
scheduler's type rather than passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypedDict, runtime_checkable

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from phalanx.utilities.optim import LRSchedulerConfig

__all__ = [
    "EVAL_DATALOADERS",
    "DistributedDataParallel",
    "LRScheduler",
    "LRSchedulerConfig",
    "LRSchedulerConfigType",
    "LRSchedulerPLType",
    "LRSchedulerType",
    "LRSchedulerTypeTuple",
    "LRSchedulerTypeUnion",
    "OptimizerConfig",
    "OptimizerLRScheduler",
    "OptimizerLRSchedulerConfig",
    "ReduceLROnPlateau",
    "STEP_OUTPUT",
    "TRAIN_DATALOADERS",
]

#: What ``training_step`` & co. may return: a loss tensor, a dict holding ``"loss"``, or None (skip the step).
STEP_OUTPUT = Tensor | Mapping[str, Any] | None
#: ``train_dataloader()``'s return: any iterable, or a collection of iterables.
TRAIN_DATALOADERS = Any
#: ``val/test/predict_dataloader()``'s return: any iterable, or a collection of iterables.
EVAL_DATALOADERS = Any

#: For ``isinstance`` checks: every scheduler class torch has derives from one of these.
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = LRScheduler | ReduceLROnPlateau
LRSchedulerType = type[LRScheduler] | type[ReduceLROnPlateau]
LRSchedulerPLType = LRScheduler | ReduceLROnPlateau


@runtime_checkable
class DistributedDataParallel(Protocol):
    """A data-parallel wrapper, for annotations and ``isinstance``: what it must offer is ``no_sync()``.

    torch's ``DistributedDataParallel`` satisfies it; so does any wrapper that can skip the gradient
    synchronisation of an accumulation step.
    """

    def no_sync(self) -> AbstractContextManager[Any]:
        """A context in which backward accumulates gradients locally, without synchronising them."""
        ...


class _LRSchedulerConfigRequired(TypedDict):
    scheduler: LRSchedulerTypeUnion


class LRSchedulerConfigType(_LRSchedulerConfigRequired, total=False):
    """The ``"lr_scheduler"`` dict ``configure_optimizers`` may return; only ``scheduler`` is required."""

    name: str | None
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: str | None
    strict: bool


class OptimizerConfig(TypedDict):
    """``{"optimizer": optimizer}``."""

    optimizer: Optimizer


class _OptimizerLRSchedulerRequired(TypedDict):
    optimizer: Optimizer
    lr_scheduler: LRSchedulerTypeUnion | LRSchedulerConfigType


class OptimizerLRSchedulerConfig(_OptimizerLRSchedulerRequired, total=False):
    """``{"optimizer": ..., "lr_scheduler": ..., "monitor": ...}`` with ``monitor`` optional."""

    monitor: str


#: Every shape ``configure_optimizers`` may return (see :mod:`phalanx.utilities.optim`).
OptimizerLRScheduler = (
    Optimizer
    | Sequence[Optimizer]
    | tuple[Sequence[Optimizer], Sequence[LRSchedulerTypeUnion | LRSchedulerConfig]]
    | OptimizerConfig
    | OptimizerLRSchedulerConfig
    | Sequence[OptimizerConfig]
    | Sequence[OptimizerLRSchedulerConfig]
    | None
)
