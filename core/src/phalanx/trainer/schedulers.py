"""Stepping the learning-rate schedulers the module configured, at their interval and frequency.

Lightning's rules: ``interval`` "step" counts optimizer steps, "epoch" completed epochs; a
``ReduceLROnPlateau`` reads its ``monitor`` from the logged metrics, and a missing one is an error
(or, with ``strict: False``, a warning). Manual optimization steps its own schedulers.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["step_schedulers"]


def step_schedulers(run: Run, interval: str, *, global_step: int, epoch: int) -> None:
    """Step every scheduler of ``interval`` ("step" or "epoch") that is due at this position."""
    configs = run.strategy.lr_scheduler_configs
    if not configs or not run.module.automatic_optimization:
        return
    callback_metrics = run.metrics.callback_metrics
    for config in configs:
        if config.interval != interval:
            continue
        index = global_step if interval == "step" else epoch + 1
        if index % config.frequency:
            continue
        if config.reduce_on_plateau:
            value = callback_metrics.get(config.monitor or "")
            if value is None:
                msg = (
                    f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; logged metrics: "
                    f"{sorted(callback_metrics)}. Log it with self.log({config.monitor!r}, ...) or "
                    "set 'strict': False in the scheduler dict."
                )
                if config.strict:
                    raise MisconfigurationError(msg)
                warnings.warn(msg, stacklevel=2)
                continue
            run.module.lr_scheduler_step(config.scheduler, float(value))
        else:
            run.module.lr_scheduler_step(config.scheduler, None)
