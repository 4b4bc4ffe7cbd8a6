"""The lifecycle hooks the Trainer calls on a strategy.

They are no-ops on purpose: most strategies need none, and those that do (XLA marks steps, DDP
tears down peers on exceptions) override just the ones they need. Kept apart from ``strategy.py``
so the core contract there stays readable.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StrategyHooks"]


class StrategyHooks:
    """No-op ``on_*`` hooks mixed into :class:`~phalanx.strategies.strategy.Strategy`."""

    def on_train_start(self) -> None:
        """Called when training begins."""

    def on_train_end(self) -> None:
        """Called when training ends."""

    def on_validation_start(self) -> None:
        """Called when validation begins."""

    def on_validation_end(self) -> None:
        """Called when validation ends."""

    def on_test_start(self) -> None:
        """Called when testing begins."""

    def on_test_end(self) -> None:
        """Called when testing ends."""

    def on_predict_start(self) -> None:
        """Called when prediction begins."""

    def on_predict_end(self) -> None:
        """Called when prediction ends."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Called before anything else happens for a training batch."""

    def on_exception(self, exception: BaseException) -> None:
        """Called when the run is interrupted by ``exception`` (parallel strategies stop peers)."""

    def post_training_step(self) -> None:
        """Runs right after each ``training_step`` of automatic optimization, before backward (as in
        Lightning; nothing by default). A strategy that overrides it keeps the layered step."""
