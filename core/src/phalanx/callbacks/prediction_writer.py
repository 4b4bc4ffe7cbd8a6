"""BasePredictionWriter: write predictions to disk as they are made, on every rank.

``trainer.predict(...)`` returns the predictions of this process only and keeps them all in
memory; for a large dataset on several processes, each rank should write its own share instead.
A writer receives, with each prediction, the dataset indices of the samples it covers
(``batch_indices``), so the files of all ranks can be put back in dataset order. Names, arguments
and call order are Lightning's.

The predict loop fills :attr:`BasePredictionWriter.record` (a :class:`PredictionRecord`): the
indices of the current batch, and per dataloader those of the whole epoch and the predictions,
which it keeps for epoch-interval writers even with ``return_predictions=False``. With a writer and
several processes, the loop shards the data without padding (Lightning's unrepeated sampler), so
the ranks' indices cover the dataset exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["BasePredictionWriter", "PredictionRecord", "WriteInterval"]


class WriteInterval(str, Enum):
    """When a writer writes: after each batch, once after the epoch, or both."""

    BATCH = "batch"
    EPOCH = "epoch"
    BATCH_AND_EPOCH = "batch_and_epoch"

    @property
    def on_batch(self) -> bool:
        """Whether ``write_on_batch_end`` is called."""
        return self in (WriteInterval.BATCH, WriteInterval.BATCH_AND_EPOCH)

    @property
    def on_epoch(self) -> bool:
        """Whether ``write_on_epoch_end`` is called."""
        return self in (WriteInterval.EPOCH, WriteInterval.BATCH_AND_EPOCH)


@dataclass
class PredictionRecord:
    """What the predict loop tells writers.

    Attributes:
        current_batch_indices: Dataset indices of the batch just predicted (None when the loader
            has no batch sampler to read them from, e.g. an iterable dataset).
        epoch_batch_indices: Per dataloader, the indices of every batch predicted so far.
        epoch_predictions: Per dataloader, every prediction made so far (for epoch writers).
    """

    current_batch_indices: list[int] | None = None
    epoch_batch_indices: list[list[list[int]]] = field(default_factory=list)
    epoch_predictions: list[list[Any]] = field(default_factory=list)

    @property
    def predictions(self) -> Any:
        """Lightning's ``predict_loop.predictions``: a flat list for one dataloader, else one list each."""
        return self.epoch_predictions[0] if len(self.epoch_predictions) == 1 else self.epoch_predictions


class BasePredictionWriter(Callback):
    """Base class of callbacks that write predictions; override one or both ``write_on_*`` methods.

    Example::

        class PerRankWriter(BasePredictionWriter):
            def __init__(self, output_dir):
                super().__init__(write_interval="epoch")
                self.output_dir = output_dir

            def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
                torch.save(predictions, f"{self.output_dir}/predictions_{trainer.global_rank}.pt")
                torch.save(batch_indices, f"{self.output_dir}/batch_indices_{trainer.global_rank}.pt")

    Args:
        write_interval: ``"batch"``, ``"epoch"`` or ``"batch_and_epoch"``.

    Raises:
        MisconfigurationError: ``write_interval`` is not one of those.
    """

    def __init__(self, write_interval: str = "batch") -> None:
        choices = [interval.value for interval in WriteInterval]
        if write_interval not in choices:
            msg = f"`write_interval` should be one of {choices}, got {write_interval!r}: pass one of them."
            raise MisconfigurationError(msg)
        self.interval = WriteInterval(write_interval)
        #: Filled by the predict loop (module docstring).
        self.record = PredictionRecord()

    def write_on_batch_end(
        self,
        trainer: TrainerView,
        pl_module: Module,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Write one batch's ``prediction``; ``batch_indices`` are its samples' dataset indices."""
        raise NotImplementedError

    def write_on_epoch_end(
        self, trainer: TrainerView, pl_module: Module, predictions: Sequence[Any], batch_indices: Sequence[Any]
    ) -> None:
        """Write all of this rank's ``predictions``; ``batch_indices[dataloader][batch]`` are the indices."""
        raise NotImplementedError

    def on_predict_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Hand the batch to :meth:`write_on_batch_end` (batch intervals)."""
        if self.interval.on_batch:
            indices = self.record.current_batch_indices
            self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Hand everything to :meth:`write_on_epoch_end` (epoch intervals)."""
        if self.interval.on_epoch:
            record = self.record
            self.write_on_epoch_end(trainer, pl_module, record.predictions, record.epoch_batch_indices)
