"""Read-only batch counts in the shape of Lightning's loop progress (``batch_progress.total.completed``).

Lightning's loops keep progress trackers (``ready``, ``started``, ``processed``, ``completed``, each
for the whole run and for the current epoch or evaluation run) to restart mid-loop; scripts and
tests read them, most often ``trainer.fit_loop.epoch_loop.val_loop.batch_progress.total.completed``
(how many validation batches ran during fit). phalanx's loops restart from their own state, so they
keep plain counts and offer them here as frozen snapshots: reading them works as in Lightning,
writing them is not possible. Between batches every stage equals ``completed`` (phalanx counts a
batch when its ``on_*_batch_end`` has run).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchProgress", "ProgressCounts"]


@dataclass(frozen=True)
class ProgressCounts:
    """Batches counted in one scope (``total`` or ``current``); Lightning's tracker fields."""

    completed: int = 0

    @property
    def ready(self) -> int:
        """Batches fetched (equal to :attr:`completed` between batches)."""
        return self.completed

    @property
    def started(self) -> int:
        """Batches whose ``on_*_batch_start`` ran (equal to :attr:`completed` between batches)."""
        return self.completed

    @property
    def processed(self) -> int:
        """Batches whose step ran (equal to :attr:`completed` between batches)."""
        return self.completed


@dataclass(frozen=True)
class BatchProgress:
    """``total``: batches since fit started (the sanity check not counted); ``current``: in this epoch or run."""

    total: ProgressCounts
    current: ProgressCounts
    is_last_batch: bool = False

    @classmethod
    def of(cls, total: int, current: int, *, is_last_batch: bool = False) -> BatchProgress:
        """A snapshot from two counts."""
        return cls(ProgressCounts(total), ProgressCounts(current), is_last_batch)
