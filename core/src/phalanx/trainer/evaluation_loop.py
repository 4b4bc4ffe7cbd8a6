"""Validation and test loops: the model in eval mode, no gradients, metrics aggregated per run.

One class serves both stages; only the hook and step names differ. With several dataloaders the
step receives ``dataloader_idx`` and logged names get a ``/dataloader_idx_N`` suffix, as in Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from phalanx.trainer.data import limit_batches, num_batches, prepare_loader
from phalanx.trainer.metrics import MetricStore
from phalanx.trainer_view import RunningStage

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["EvaluationLoop"]

_NAMES = {
    "validate": ("validation", RunningStage.VALIDATING, "limit_val_batches"),
    "test": ("test", RunningStage.TESTING, "limit_test_batches"),
}


class EvaluationLoop:
    """Runs ``validation_step`` or ``test_step`` over the evaluation dataloaders.

    Args:
        stage: ``"validate"`` or ``"test"``.
    """

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self._prefix, self._running_stage, self._limit_name = _NAMES[stage]
        self.dataloaders: list[Any] = []
        self.num_batches: list[float] = []
        self.has_run = False

    def setup(self, run: Run, loaders: list[Any]) -> None:
        """Prepare the dataloaders and count their batches (after ``limit_*_batches``)."""
        config = run.config
        limit = getattr(config, self._limit_name)
        self.has_run = False
        self.dataloaders = [
            prepare_loader(loader, run.strategy, use_distributed_sampler=config.use_distributed_sampler, shuffle=False)
            for loader in loaders
        ]
        self.num_batches = [limit_batches(limit, num_batches(dl), name=self._limit_name) for dl in self.dataloaders]

    def run(self, run: Run) -> list[dict[str, float]]:
        """Evaluate once; returns one dict of epoch metrics per dataloader."""
        strategy, hooks, connector = run.strategy, run.hooks, run.metrics
        prefix = f"on_{self._prefix}"
        step = getattr(strategy, f"{self._prefix}_step")
        step_name = f"{self._prefix}_step"
        previous_stage = run.stage
        run.stage = self._running_stage
        connector.stage = self.stage
        connector.reset(self.stage)
        was_training = run.trainer.model.training
        hooks.call_module(f"{prefix}_model_eval")
        multiple = len(self.dataloaders) > 1
        try:
            with torch.no_grad():
                hooks.call(f"{prefix}_start")
                getattr(strategy, f"{prefix}_start")()
                hooks.call(f"{prefix}_epoch_start")
                for dataloader_idx, (loader, limit) in enumerate(zip(self.dataloaders, self.num_batches)):
                    if limit == 0:
                        continue
                    extra = (dataloader_idx,) if multiple else ()
                    for batch_idx, batch in enumerate(loader):
                        if batch_idx >= limit:
                            break
                        batch = strategy.batch_to_device(batch, dataloader_idx=dataloader_idx)
                        connector.begin_batch(batch, dataloader_idx if multiple else None)
                        hooks.call(f"{prefix}_batch_start", batch, batch_idx, *extra)
                        hooks.current = step_name
                        output = step(batch, batch_idx, *extra)
                        connector.flush_step()
                        hooks.call(f"{prefix}_batch_end", output, batch, batch_idx, *extra)
                connector.begin_batch(None)
                hooks.call(f"{prefix}_epoch_end")
                published = connector.epoch_end(self.stage)
                self.has_run = True
                hooks.call(f"{prefix}_end")
                getattr(strategy, f"{prefix}_end")()
        finally:
            if was_training:
                hooks.call_module(f"{prefix}_model_train")
            connector.stage = "train"
            run.stage = previous_stage
        return MetricStore.results(published, len(self.dataloaders))
