"""The predict loop: ``predict_step`` over the predict dataloaders, collecting the outputs.

Predictions stay where ``predict_step`` put them (usually on the device); with several processes
each rank returns the predictions for its own shard of the data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from phalanx.trainer.data import limit_batches, num_batches, prepare_loader
from phalanx.trainer.state import RunningStage

if TYPE_CHECKING:
    from phalanx.trainer.trainer import Trainer

__all__ = ["PredictLoop"]


class PredictLoop:
    """Runs ``predict_step`` and returns one list of outputs per dataloader."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.dataloaders: list[Any] = []
        self.num_batches: list[float] = []

    def setup(self, loaders: list[Any]) -> None:
        """Prepare the dataloaders and count their batches (after ``limit_predict_batches``)."""
        trainer = self.trainer
        self.dataloaders = [
            prepare_loader(
                loader, trainer.strategy, use_distributed_sampler=trainer.use_distributed_sampler, shuffle=False
            )
            for loader in loaders
        ]
        self.num_batches = [
            limit_batches(trainer.limit_predict_batches, num_batches(dl), name="limit_predict_batches")
            for dl in self.dataloaders
        ]

    def run(self, *, return_predictions: bool) -> list[Any] | None:
        """Predict; a flat list for one dataloader, a list of lists for several."""
        trainer = self.trainer
        strategy = trainer.strategy
        trainer.state.stage = RunningStage.PREDICTING
        was_training = trainer.model.training
        trainer._call_module_hook("on_predict_model_eval")
        multiple = len(self.dataloaders) > 1
        results: list[list[Any]] = [[] for _ in self.dataloaders]
        with torch.no_grad():
            trainer._call_hooks("on_predict_start")
            strategy.on_predict_start()
            trainer._call_hooks("on_predict_epoch_start")
            for dataloader_idx, (loader, limit) in enumerate(zip(self.dataloaders, self.num_batches)):
                extra = (dataloader_idx,) if multiple else ()
                for batch_idx, batch in enumerate(loader):
                    if batch_idx >= limit:
                        break
                    batch = strategy.batch_to_device(batch, dataloader_idx=dataloader_idx)
                    trainer._call_hooks("on_predict_batch_start", batch, batch_idx, *extra)
                    trainer._current_fx = "predict_step"
                    output = strategy.predict_step(batch, batch_idx, *extra)
                    trainer._call_hooks("on_predict_batch_end", output, batch, batch_idx, *extra)
                    if return_predictions:
                        results[dataloader_idx].append(output)
            trainer._call_hooks("on_predict_epoch_end")
            trainer._call_hooks("on_predict_end")
            strategy.on_predict_end()
        if was_training:
            trainer.model.train()
        if not return_predictions:
            return None
        return results if multiple else results[0]
