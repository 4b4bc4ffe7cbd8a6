"""Logging must not read values back to the host on steps where nothing is written or shown.

On CUDA and XLA every ``.item()`` / ``float(tensor)`` is a device->host transfer that stalls the
step, so the Trainer keeps logged values as tensors and converts them only when a logger write is
due (every ``log_every_n_steps``), the bar refreshes, or an epoch ends. Every such conversion goes
through ``aten._local_scalar_dense``, which a dispatch mode can count per step.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from trainer_helpers import Net, loader, quiet

from phalanx.callbacks.callback import Callback
from phalanx.callbacks.progress import TQDMProgressBar
from phalanx.loggers.logger import Logger
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer

_SCALAR_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}


class _CountHostReads(TorchDispatchMode):
    """Counts tensor -> Python number conversions, attributed to the current global step."""

    def __init__(self) -> None:
        super().__init__()
        self.step = -1
        self.by_step: dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _SCALAR_READS:
            self.by_step[self.step] = self.by_step.get(self.step, 0) + 1
        return func(*args, **(kwargs or {}))


class _StepTracker(Callback):
    def __init__(self, mode: _CountHostReads) -> None:
        self.mode = mode

    def on_train_batch_start(self, trainer: Trainer, pl_module: Module, batch: Any, batch_idx: int) -> None:
        self.mode.step = trainer.global_step  # the step this batch will produce


class _Recorder(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        assert all(isinstance(value, float) for value in metrics.values())
        self.steps.append(int(step or 0))

    def log_hyperparams(self, params: Any) -> None:
        pass


@pytest.mark.parametrize("bar", [False, True], ids=["no_bar", "bar_every_5"])
def test_no_host_sync_on_non_logging_steps(bar: bool) -> None:
    mode = _CountHostReads()
    recorder = _Recorder()
    callbacks: list[Callback] = [_StepTracker(mode)]
    if bar:  # the bar reads its metrics only when it refreshes (every 5 batches here)
        callbacks.append(TQDMProgressBar(refresh_rate=5))
    trainer = Trainer(
        **quiet(logger=recorder, max_epochs=1, log_every_n_steps=5, callbacks=callbacks, enable_progress_bar=bar)
    )
    model = Net(dropout=0.0)
    data = loader(n=40, batch_size=4)  # 10 steps in one epoch
    with mode:
        trainer.fit(model, data)
    assert trainer.global_step == 10
    assert recorder.steps[:2] == [4, 9]
    reads = {step: count for step, count in mode.by_step.items() if step >= 0}
    # only the logging steps (global steps 4 and 9, which also ends the epoch) read values back, and
    # they must: equality, not a subset, so a counter that saw nothing (a dispatch mode that stopped
    # intercepting, a logger that stopped converting) fails here instead of passing vacuously
    assert set(reads) == {4, 9}, reads
    assert all(count >= 1 for count in reads.values()), reads
    assert isinstance(trainer.callback_metrics["train_loss"], torch.Tensor)
    assert trainer.callback_metrics["train_loss"].requires_grad is False


def test_host_read_counter_counts() -> None:
    """The counter itself: one ``float(tensor)`` inside the mode is one read (a positive control)."""
    mode = _CountHostReads()
    mode.step = 3
    with mode:
        value = float(torch.ones(()) * 2)
    assert value == 2.0
    assert mode.by_step == {3: 1}
