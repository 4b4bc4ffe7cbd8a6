"""The predict loop: ``predict_step`` over the predict dataloaders, collecting the outputs.

Predictions stay where ``predict_step`` put them (usually on the device); with several processes
each rank returns the predictions for its own shard of the data.

With a :class:`~phalanx.callbacks.prediction_writer.BasePredictionWriter` among the callbacks, the
loop also records which dataset indices each batch holds (by wrapping the batch sampler, as
Lightning does) and hands them to the writers; with several processes the data is then sharded
without padding, so the ranks' files cover the dataset exactly once. Without a writer nothing of
this runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from phalanx.callbacks.prediction_writer import BasePredictionWriter, PredictionRecord
from phalanx.trainer.data import _rebuild, _rebuildable, limit_batches, num_batches, prepare_loader
from phalanx.trainer.evaluation_loop import ModuleModes, no_grad_context, profiled
from phalanx.trainer.step import takes_batch_idx
from phalanx.trainer_view import RunningStage

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["IndexRecordingBatchSampler", "PredictLoop", "UnrepeatedDistributedSampler"]


class UnrepeatedDistributedSampler(DistributedSampler):  # type: ignore[type-arg]
    """A DistributedSampler that does not pad: rank ``r`` takes indices ``r, r + n, r + 2n, ...``.

    DistributedSampler repeats samples so every rank gets as many; for prediction that would write
    some samples twice, so ranks may instead differ by one sample.
    """

    def __init__(self, dataset: Any, *, num_replicas: int, rank: int, shuffle: bool = False, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.total_size = len(dataset)
        self.num_samples = len(range(rank, self.total_size, num_replicas))

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:  # the same permutation as DistributedSampler's for this seed and epoch
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(self.total_size, generator=generator).tolist()
        else:
            indices = list(range(self.total_size))
        return iter(indices[self.rank : self.total_size : self.num_replicas])


class IndexRecordingBatchSampler:
    """Wraps a batch sampler and keeps the index lists it yields, in order (``seen``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        self.seen = []
        for indices in self.inner:
            self.seen.append(list(indices))
            yield indices

    def __len__(self) -> int:
        return len(self.inner)


def _unrepeated(loader: Any, shard: dict[str, int] | None, use_distributed_sampler: bool) -> Any:
    """Shard a plain map-style loader without padding, before :func:`prepare_loader` pads it."""
    if not use_distributed_sampler or shard is None or shard["num_replicas"] <= 1:
        return loader
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if isinstance(loader.sampler, DistributedSampler):
        return loader
    from phalanx.strategies._distributed import replace_sampler

    shuffle = isinstance(loader.sampler, RandomSampler)
    sampler = UnrepeatedDistributedSampler(loader.dataset, shuffle=shuffle, **shard)
    return replace_sampler(loader, sampler)


class PredictLoop:
    """Runs ``predict_step`` and returns one list of outputs per dataloader."""

    def __init__(self) -> None:
        self.dataloaders: list[Any] = []
        self.num_batches: list[float] = []
        self._recorders: list[IndexRecordingBatchSampler | None] = []
        self._record: PredictionRecord | None = None

    def setup(self, run: Run, loaders: list[Any]) -> None:
        """Prepare the dataloaders and count their batches (after ``limit_predict_batches``)."""
        config = run.config
        writers = self._writers(run)
        if writers:
            shard = run.strategy.distributed_sampler_kwargs
            loaders = [_unrepeated(loader, shard, config.use_distributed_sampler) for loader in loaders]
        self.dataloaders = [
            prepare_loader(loader, run.strategy, use_distributed_sampler=config.use_distributed_sampler, shuffle=False)
            for loader in loaders
        ]
        self._recorders = [None] * len(self.dataloaders)
        if writers:
            for i, loader in enumerate(self.dataloaders):
                if _rebuildable(loader):
                    recorder = IndexRecordingBatchSampler(loader.batch_sampler)
                    self.dataloaders[i] = _rebuild(loader, batch_sampler=recorder)
                    self._recorders[i] = recorder
        self.num_batches = [
            limit_batches(config.limit_predict_batches, num_batches(dl), name="limit_predict_batches")
            for dl in self.dataloaders
        ]

    @staticmethod
    def _writers(run: Run) -> list[BasePredictionWriter]:
        return [cb for cb in run.trainer.callbacks if isinstance(cb, BasePredictionWriter)]

    @property
    def epoch_batch_indices(self) -> list[list[Any]]:
        """Per dataloader, the dataset indices of each batch of the last predict run.

        Kept, like the predictions, only when something needs them: ``return_predictions`` or a
        writer with an epoch interval (Lightning's rule: ``[[]]`` otherwise).
        """
        return self._record.epoch_batch_indices if self._record is not None else []

    @property
    def predictions(self) -> list[Any]:
        """The last predict run's outputs (a flat list for one dataloader), when they were kept."""
        if self._record is None:
            return []
        kept = self._record.epoch_predictions
        return kept[0] if len(kept) == 1 else kept

    def run(self, run: Run, *, return_predictions: bool) -> list[Any] | None:
        """Predict; a flat list for one dataloader, a list of lists for several."""
        strategy, hooks, model = run.strategy, run.hooks, run.trainer.model
        run.stage = RunningStage.PREDICTING
        modes = ModuleModes(model)
        hooks.call_module("on_predict_model_eval")
        multiple = len(self.dataloaders) > 1
        writers = self._writers(run)
        record = PredictionRecord(
            epoch_batch_indices=[[] for _ in self.dataloaders], epoch_predictions=[[] for _ in self.dataloaders]
        )
        self._record = record
        for writer in writers:
            writer.record = record
        keep = return_predictions or any(writer.interval.on_epoch for writer in writers)
        with_batch_idx = takes_batch_idx(run.module.predict_step)
        step = profiled(run, strategy.predict_step, f"[Strategy]{type(strategy).__name__}.predict_step")
        with no_grad_context(run):
            hooks.call("on_predict_start")
            strategy.on_predict_start()
            hooks.call("on_predict_epoch_start")
            for dataloader_idx, (loader, limit) in enumerate(zip(self.dataloaders, self.num_batches)):
                extra = (dataloader_idx,) if multiple else ()
                recorder = self._recorders[dataloader_idx] if writers else None
                for batch_idx, batch in enumerate(loader):
                    if batch_idx >= limit:
                        break
                    if writers:
                        indices = recorder.seen[batch_idx] if recorder is not None else None
                        record.current_batch_indices = indices
                        if indices is not None and keep:
                            record.epoch_batch_indices[dataloader_idx].append(indices)
                    batch = strategy.batch_to_device(batch, dataloader_idx=dataloader_idx)
                    hooks.call("on_predict_batch_start", batch, batch_idx, *extra)
                    hooks.current = "predict_step"
                    output = step(batch, batch_idx, *extra) if with_batch_idx else step(batch, *extra)
                    if keep:
                        record.epoch_predictions[dataloader_idx].append(output)
                    hooks.call("on_predict_batch_end", output, batch, batch_idx, *extra)
            hooks.call("on_predict_epoch_end")
            hooks.call("on_predict_end")
            strategy.on_predict_end()
        modes.restore()  # each submodule's own mode back, as Lightning's prediction loop does
        if not return_predictions:
            return None
        results = record.epoch_predictions
        return results if multiple else results[0]
