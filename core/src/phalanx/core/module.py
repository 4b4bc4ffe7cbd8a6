"""``lightning.pytorch.core.module`` under the rename rule: ``Module`` (Lightning's ``LightningModule``)."""

from __future__ import annotations

from typing import TypeAlias

from torch.optim import Optimizer

from phalanx.core.optimizer import LightningOptimizer
from phalanx.module import Module

__all__ = ["MODULE_OPTIMIZERS", "Module"]

#: What ``Module.optimizers()`` returns: one optimizer or a list, each wrapped or plain (``use_pl_optimizer``).
MODULE_OPTIMIZERS: TypeAlias = Optimizer | LightningOptimizer | list[Optimizer] | list[LightningOptimizer]
