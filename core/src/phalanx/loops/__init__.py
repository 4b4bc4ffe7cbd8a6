"""``lightning.pytorch.loops``: where Lightning keeps its loop objects, for the names scripts import.

phalanx has no loop objects to subclass or replace: the fit loop is :mod:`phalanx.trainer.fit_loop`
and one training step is :mod:`phalanx.trainer.step`. The modules below this package re-export what
Lightning code imports from here: ``phalanx.loops.optimization.automatic.Closure`` (the closure
``Module.optimizer_step`` receives) and ``phalanx.loops.utilities.check_finite_loss``.
"""

from __future__ import annotations

__all__: list[str] = []
