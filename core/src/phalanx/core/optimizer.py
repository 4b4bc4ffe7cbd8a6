"""``lightning.pytorch.core.optimizer``: the optimizer wrapper ``Module.optimizers()`` returns.

:class:`LightningOptimizer` is phalanx's step wrapper (:class:`phalanx.trainer.step.StepOptimizer`)
under Lightning's name: ``step(closure)`` goes through the strategy and the precision (loss
scaling, skipped steps, the optimizer-step hooks), ``zero_grad`` clears the gradients, and any
other attribute (``param_groups``, ``state``) is the wrapped optimizer's; ``.optimizer`` is the
optimizer itself.
"""

from __future__ import annotations

from phalanx.trainer.step import StepOptimizer

__all__ = ["LightningOptimizer", "do_nothing_closure"]

LightningOptimizer = StepOptimizer


def do_nothing_closure() -> None:
    """A closure for ``optimizer.step`` that computes nothing (the step after a manual backward)."""
    return None
