"""``lightning.pytorch.loops.optimization.automatic``: the closure of an automatic-optimization step.

``Module.optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)`` receives a
:class:`Closure`: calling it runs ``training_step``, ``zero_grad`` (at the start of an accumulation
window) and ``backward``, and returns the loss, so ``optimizer.step(closure=optimizer_closure)``
works for optimizers that re-evaluate the loss (LBFGS). It is phalanx's
:class:`phalanx.trainer.step.TrainingStep` under Lightning's name, so
``isinstance(optimizer_closure, Closure)`` holds as in Lightning.
"""

from __future__ import annotations

from phalanx.trainer.step import TrainingStep

__all__ = ["Closure"]

Closure = TrainingStep
