"""Lightning's sanity check: a few validation batches before training, to fail fast."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx.trainer.checkpointing import capture_rng, restore_rng
from phalanx.trainer_view import RunningStage

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["run_sanity_check"]


def run_sanity_check(run: Run, generators: Any) -> None:
    """Validate ``num_sanity_val_steps`` batches per dataloader before training, to fail fast.

    Lightning's sanity check: callbacks see ``trainer.sanity_checking``; nothing is logged,
    the metrics and the random streams are as before, so training computes what it would without it.
    """
    limit = run.config.num_sanity_val_steps
    if not limit or not run.has_validation:
        return
    hooks, metrics = run.hooks, run.metrics
    saved = (dict(metrics.callback_metrics), dict(metrics.progress_bar), capture_rng(generators))
    run.stage = RunningStage.SANITY_CHECKING
    try:
        hooks.call_callbacks("on_sanity_check_start")
        run.val_loop.run(run, max_batches=limit, stage=RunningStage.SANITY_CHECKING)
        hooks.call_callbacks("on_sanity_check_end")
    finally:
        run.stage = RunningStage.TRAINING
        metrics.callback_metrics.clear()
        metrics.callback_metrics.update(saved[0])
        metrics.progress_bar.clear()
        metrics.progress_bar.update(saved[1])
        restore_rng(saved[2], generators)
        run.val_loop.has_run = False
