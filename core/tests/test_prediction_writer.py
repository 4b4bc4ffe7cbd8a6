"""BasePredictionWriter: batch and epoch writes carry the samples' dataset indices; with two ranks each
rank writes its own file and together they cover the dataset exactly once, equal to model(x).

The two-process test runs this file as a script (``python test_prediction_writer.py OUT``) under the
core's own ParallelStrategy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx.callbacks.prediction_writer import BasePredictionWriter
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.testing.processes import Job
from phalanx.trainer.trainer import Trainer

N = 11  # odd: a padding sampler would predict one sample twice on two ranks


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(N, 3, generator=g))


class Net(Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0])


class Writer(BasePredictionWriter):
    """Remembers every call; saves its rank's epoch predictions to ``out`` when given."""

    def __init__(self, interval: str, out: str | None = None) -> None:
        super().__init__(interval)
        self.out = out
        self.batches: list[tuple[list[int], torch.Tensor, int]] = []
        self.epochs: list[tuple[Any, Any]] = []

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any,
                           batch_idx: int, dataloader_idx: int) -> None:  # fmt: skip
        self.batches.append((list(batch_indices), prediction, dataloader_idx))

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        self.epochs.append((predictions, batch_indices))
        if self.out is not None:
            torch.save(
                {"predictions": predictions, "indices": batch_indices}, f"{self.out}/rank{trainer.global_rank}.pt"
            )


def _predict(writer: Writer, **kwargs: Any) -> Any:
    trainer = Trainer(accelerator="cpu", callbacks=[writer], logger=False, enable_progress_bar=False)
    return trainer.predict(Net(), DataLoader(_data(), batch_size=4, shuffle=True), **kwargs)


def test_batch_interval_gets_each_batchs_dataset_indices() -> None:
    torch.manual_seed(3)
    writer = Writer("batch")
    _predict(writer, return_predictions=False)
    model, x = Net(), _data().tensors[0]
    assert sorted(i for indices, _, _ in writer.batches for i in indices) == list(range(N))
    assert [len(indices) for indices, _, _ in writer.batches] == [4, 4, 3]
    assert writer.batches[0][0] != [0, 1, 2, 3]  # shuffled: the indices are the sampler's, not positions
    for indices, prediction, dataloader_idx in writer.batches:
        torch.testing.assert_close(prediction, model(x[indices]), rtol=0, atol=0)
        assert dataloader_idx == 0
    assert writer.epochs == []


def test_epoch_interval_gets_all_predictions_even_without_return_predictions() -> None:
    writer = Writer("epoch")
    assert _predict(writer, return_predictions=False) is None
    assert writer.batches == []
    ((predictions, indices),) = writer.epochs
    assert len(indices) == 1 and len(indices[0]) == 3  # one dataloader, three batches
    flat = [i for batch in indices[0] for i in batch]
    expected = Net()(_data().tensors[0][flat])
    torch.testing.assert_close(torch.cat(predictions), expected, rtol=0, atol=0)


def test_batch_and_epoch_interval_calls_both() -> None:
    writer = Writer("batch_and_epoch")
    returned = _predict(writer)
    assert len(writer.batches) == 3 and len(writer.epochs) == 1
    assert all(a is b for a, b in zip(returned, writer.epochs[0][0]))


def test_invalid_interval_names_the_choices() -> None:
    with pytest.raises(MisconfigurationError, match=r"\['batch', 'epoch', 'batch_and_epoch'\].*'step'"):
        Writer("step")


@pytest.mark.timeout(150)
def test_two_ranks_write_their_own_files_covering_the_dataset_once(tmp_path: Path) -> None:
    job = Job([sys.executable, __file__, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=120)
    assert code == 0, job.output()
    assert job.leftovers() == [], job.output()
    files = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    x, model = _data().tensors[0], Net()
    seen: list[int] = []
    for saved in files:
        indices = [i for batch in saved["indices"][0] for i in batch]
        assert indices  # both ranks predicted something
        torch.testing.assert_close(torch.cat(saved["predictions"]), model(x[indices]), rtol=0, atol=0)
        seen += indices
    assert sorted(seen) == list(range(N))  # exactly once: no padding duplicates


def _rank_main(out: str) -> None:
    from phalanx.strategies import ParallelStrategy

    trainer = Trainer(accelerator="cpu", devices=2, strategy=ParallelStrategy(), callbacks=[Writer("epoch", out)],
                      logger=False, enable_progress_bar=False)  # fmt: skip
    trainer.predict(Net(), DataLoader(_data(), batch_size=2), return_predictions=False)


if __name__ == "__main__":
    _rank_main(sys.argv[1])
