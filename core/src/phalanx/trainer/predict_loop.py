"""The predict loop: ``predict_step`` over the predict dataloaders, collecting the outputs.

Predictions stay where ``predict_step`` put them (usually on the device); with several processes
each rank returns the predictions for its own shard of the data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx.trainer.data import limit_batches, num_batches, prepare_loader
from phalanx.trainer.evaluation_loop import no_grad_context, profiled
from phalanx.trainer.step import takes_batch_idx
from phalanx.trainer_view import RunningStage

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["PredictLoop"]


class PredictLoop:
    """Runs ``predict_step`` and returns one list of outputs per dataloader."""

    def __init__(self) -> None:
        self.dataloaders: list[Any] = []
        self.num_batches: list[float] = []

    def setup(self, run: Run, loaders: list[Any]) -> None:
        """Prepare the dataloaders and count their batches (after ``limit_predict_batches``)."""
        config = run.config
        self.dataloaders = [
            prepare_loader(loader, run.strategy, use_distributed_sampler=config.use_distributed_sampler, shuffle=False)
            for loader in loaders
        ]
        self.num_batches = [
            limit_batches(config.limit_predict_batches, num_batches(dl), name="limit_predict_batches")
            for dl in self.dataloaders
        ]

    def run(self, run: Run, *, return_predictions: bool) -> list[Any] | None:
        """Predict; a flat list for one dataloader, a list of lists for several."""
        strategy, hooks, model = run.strategy, run.hooks, run.trainer.model
        run.stage = RunningStage.PREDICTING
        was_training = model.training
        hooks.call_module("on_predict_model_eval")
        multiple = len(self.dataloaders) > 1
        results: list[list[Any]] = [[] for _ in self.dataloaders]
        with_batch_idx = takes_batch_idx(run.module.predict_step)
        step = profiled(run, strategy.predict_step, f"[Strategy]{type(strategy).__name__}.predict_step")
        with no_grad_context(run):
            hooks.call("on_predict_start")
            strategy.on_predict_start()
            hooks.call("on_predict_epoch_start")
            for dataloader_idx, (loader, limit) in enumerate(zip(self.dataloaders, self.num_batches)):
                extra = (dataloader_idx,) if multiple else ()
                for batch_idx, batch in enumerate(loader):
                    if batch_idx >= limit:
                        break
                    batch = strategy.batch_to_device(batch, dataloader_idx=dataloader_idx)
                    hooks.call("on_predict_batch_start", batch, batch_idx, *extra)
                    hooks.current = "predict_step"
                    output = step(batch, batch_idx, *extra) if with_batch_idx else step(batch, *extra)
                    hooks.call("on_predict_batch_end", output, batch, batch_idx, *extra)
                    if return_predictions:
                        results[dataloader_idx].append(output)
            hooks.call("on_predict_epoch_end")
            hooks.call("on_predict_end")
            strategy.on_predict_end()
        if was_training:
            model.train()
        if not return_predictions:
            return None
        return results if multiple else results[0]
