"""When fit validates: ``val_check_interval`` resolved against the epoch, and the check per batch.

Lightning's rules: an int interval counts batches (within the epoch, or across epochs with
``check_val_every_n_epoch=None``), a float is a fraction of the epoch (1.0: at its end), and
``check_val_every_n_epoch`` skips whole epochs. A duration (``"DD:HH:MM:SS"``, a timedelta)
validates after the first batch that ends once that much wall-clock time has passed since fit
started or the last validation ended.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.trainer.config import TrainerConfig
    from phalanx.trainer.run import Run

__all__ = ["should_validate", "val_check_batch"]


def val_check_batch(config: TrainerConfig, num_batches: float) -> float:
    """Batches between validation checks (``inf``: at the end of the epoch only).

    Raises:
        MisconfigurationError: An interval that does not fit the training dataloader.
    """
    interval = config.val_check_interval
    if isinstance(interval, timedelta):
        return math.inf  # decided by the clock (should_validate), not by a batch count
    if isinstance(interval, int):
        if config.check_val_every_n_epoch is not None and interval > num_batches:
            msg = (
                f"Trainer(val_check_interval={interval}) must be less than or equal to the number of the training "
                f"batches of an epoch ({int(num_batches)}). Pass a smaller value, or check_val_every_n_epoch=None "
                "to count batches across epochs; to disable validation use limit_val_batches=0."
            )
            raise MisconfigurationError(msg)
        return float(interval)
    if math.isinf(num_batches):
        if interval != 1.0:
            msg = (
                f"Trainer(val_check_interval={interval}) is a fraction of an epoch, but the training dataloader "
                "has no length. Pass an int number of batches instead."
            )
            raise MisconfigurationError(msg)
        return math.inf
    return float(max(1, int(num_batches * interval)))


def should_validate(run: Run, every_batches: float, *, epoch: int, batch_idx: int, total: int, is_last: bool) -> bool:
    """Whether validation is due after batch ``batch_idx`` of ``epoch`` (``total`` batches done in fit)."""
    if not run.has_validation:
        return False
    every = run.config.check_val_every_n_epoch
    if every is not None and (epoch + 1) % every != 0:
        return False
    interval = run.config.val_check_interval
    if isinstance(interval, timedelta):
        # One clock reading per batch, in validating epochs only, as in Lightning: due once the
        # interval has passed since fit started or the last validation ended.
        if is_last and math.isinf(run.fit_loop.num_batches):
            return True
        return time.monotonic() - run.fit_loop.last_val_time >= interval.total_seconds()
    if math.isinf(every_batches):
        return is_last
    current = total if every is None else batch_idx + 1
    return current % every_batches == 0
