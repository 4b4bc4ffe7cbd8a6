"""ThroughputMonitor and the throughput utilities: the logged rates are the arithmetic of the logged
totals, FLOPs match the analytic count of a Linear layer, and MFU divides by the peak figure."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from trainer_helpers import loader, quiet

from phalanx.callbacks.callback import Callback
from phalanx.callbacks.throughput_monitor import ThroughputMonitor
from phalanx.errors import MisconfigurationError
from phalanx.loggers.logger import Logger
from phalanx.module import Module
from phalanx.trainer.trainer import Trainer
from phalanx.utilities.throughput import (
    _CUDA_FLOPS,
    CPU_FLOPS_PER_CORE,
    Throughput,
    _cuda_chip,
    get_available_flops,
    measure_flops,
)

BATCH, IN, OUT = 4, 6, 1


class Recorder(Logger):
    """Keeps every ``log_metrics`` call in memory."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.calls.append((step, dict(metrics)))


class Linear(Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(IN, OUT)
        with torch.device("meta"):
            meta = nn.Linear(IN, OUT)
            x = torch.randn(BATCH, IN)
        self.flops_per_batch = measure_flops(meta, lambda: meta(x), torch.Tensor.sum)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


# ------------------------------------------------------------------ utilities
def test_measure_flops_of_a_linear_is_the_analytic_count() -> None:
    with torch.device("meta"):
        layer = nn.Linear(IN, OUT, bias=False)
        x = torch.randn(BATCH, IN)
    forward = 2 * BATCH * IN * OUT
    assert measure_flops(layer, lambda: layer(x)) == forward
    # backward: the weight's gradient is one more matmul of the same size; the input's, when it
    # needs one, another
    assert measure_flops(layer, lambda: layer(x), torch.Tensor.sum) == 2 * forward
    x.requires_grad_(True)
    assert measure_flops(layer, lambda: layer(x), torch.Tensor.sum) == 3 * forward


def test_cpu_peak_is_cores_times_the_documented_per_core_figure() -> None:
    cores = len(os.sched_getaffinity(0))
    assert get_available_flops(torch.device("cpu"), torch.float32) == int(CPU_FLOPS_PER_CORE[torch.float32] * cores)
    assert get_available_flops(torch.device("cpu"), torch.float64) == int(50e9 * cores)
    with pytest.warns(RuntimeWarning, match="No CPU peak"):
        assert get_available_flops(torch.device("cpu"), torch.int8) is None


def test_throughput_rates_over_the_window_and_global_keys() -> None:
    throughput = Throughput(available_flops=100.0, world_size=2, window_size=3)
    for i, t in enumerate([1.0, 2.0, 4.0, 8.0], start=1):
        throughput.update(time=t, batches=i, samples=4 * i, lengths=40 * i, flops=10)
    m = throughput.compute()
    # window: times 2, 4, 8; batches 2..4; flops 20 (x world) each, the first of the window excluded
    assert (m["time"], m["batches"], m["samples"], m["lengths"]) == (8.0, 4, 16, 160)
    assert m["device/batches_per_sec"] == pytest.approx(2 / 6)
    assert m["device/samples_per_sec"] == pytest.approx(8 / 6)
    assert m["device/items_per_sec"] == pytest.approx(80 / 6)
    assert m["samples_per_sec"] == pytest.approx(2 * 8 / 6)
    assert m["flops_per_sec"] == pytest.approx(40 / 6)
    assert m["device/flops_per_sec"] == pytest.approx(20 / 6)
    assert m["device/mfu"] == pytest.approx(20 / 6 / 100)
    assert m["mfu"] == pytest.approx(m["device/mfu"])


def test_throughput_needs_running_totals_and_a_window_of_two() -> None:
    throughput = Throughput(window_size=2)
    throughput.update(time=1.0, batches=1, samples=4)
    assert "device/samples_per_sec" not in throughput.compute()  # window not full yet
    with pytest.raises(ValueError, match="running totals"):
        throughput.update(time=0.5, batches=2, samples=8)
    with pytest.raises(MisconfigurationError, match="window_size=1"):
        Throughput(window_size=1)


# ------------------------------------------------------------------ the callback
def _fit(tmp_path: Path, **kwargs: Any) -> tuple[Recorder, Linear]:
    recorder, model = Recorder(), Linear()
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0), window_size=2)
    kwargs.setdefault("log_every_n_steps", 1)
    trainer = Trainer(
        accelerator="cpu", default_root_dir=tmp_path, callbacks=[monitor], max_epochs=1,
        **quiet(logger=recorder, enable_model_summary=False, **kwargs),
    )  # fmt: skip
    trainer.fit(model, loader(n=5 * BATCH, batch_size=BATCH))
    return recorder, model


def test_logged_rates_are_the_arithmetic_of_the_logged_totals(tmp_path: Path) -> None:
    recorder, model = _fit(tmp_path)
    logs = [(step, m) for step, m in recorder.calls if "train/time" in m]
    assert [step for step, _ in logs] == [0, 1, 2, 3, 4]
    assert "train/device/samples_per_sec" not in logs[0][1]  # the window (2) fills at the second batch
    available = get_available_flops(torch.device("cpu"), torch.float32)
    assert available is not None
    assert model.flops_per_batch == 2 * (2 * BATCH * IN * OUT)  # forward and weight-gradient matmuls
    for (_, before), (_, now) in itertools.pairwise(logs):
        interval = now["train/time"] - before["train/time"]
        assert now["train/samples"] - before["train/samples"] == BATCH
        assert now["train/device/samples_per_sec"] == pytest.approx(BATCH / interval)
        assert now["train/device/batches_per_sec"] == pytest.approx(1 / interval)
        assert now["train/device/flops_per_sec"] == pytest.approx(model.flops_per_batch / interval)
        assert now["train/device/mfu"] == pytest.approx(now["train/device/flops_per_sec"] / available)
        assert "train/samples_per_sec" not in now  # one process: no global keys
        assert now["epoch"] == 0


def test_training_rates_follow_log_every_n_steps(tmp_path: Path) -> None:
    recorder, _ = _fit(tmp_path, log_every_n_steps=2)
    assert [step for step, m in recorder.calls if "train/time" in m] == [1, 3]


def test_test_loop_rates_use_the_batch_count_as_step(tmp_path: Path) -> None:
    recorder, model = Recorder(), Linear()
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0), window_size=2)
    trainer = Trainer(accelerator="cpu", callbacks=[monitor], **quiet(logger=recorder, log_every_n_steps=1))
    trainer.test(model, loader(n=3 * BATCH, batch_size=BATCH), verbose=False)
    logs = [(step, m) for step, m in recorder.calls if "test/time" in m]
    assert [step for step, _ in logs] == [1, 2, 3]
    assert [m["test/samples"] for _, m in logs] == [BATCH, 2 * BATCH, 3 * BATCH]
    interval = logs[2][1]["test/time"] - logs[1][1]["test/time"]
    assert logs[2][1]["test/device/samples_per_sec"] == pytest.approx(BATCH / interval)


def test_a_module_without_flops_per_batch_warns_and_logs_no_flops(tmp_path: Path) -> None:
    recorder, model = Recorder(), Linear()
    del model.flops_per_batch
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0), window_size=2)
    trainer = Trainer(
        accelerator="cpu", callbacks=[monitor], max_steps=3, **quiet(logger=recorder, log_every_n_steps=1)
    )
    with pytest.warns(UserWarning, match="flops_per_batch"):
        trainer.fit(model, loader(n=4 * BATCH, batch_size=BATCH))
    last = recorder.calls[-1][1]
    assert "train/device/samples_per_sec" in last and "train/device/flops_per_sec" not in last


class WithValidation(Linear):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(0.01)  # validation long enough that leaving it in the training clock shows
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y))


class WallClock(Callback):
    """Reads the clock right after the monitor measured each training batch."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.times.append(time.perf_counter())


def test_validation_inside_fit_logs_its_own_rates_and_pauses_the_training_clock(tmp_path: Path) -> None:
    recorder, model, wall = Recorder(), WithValidation(), WallClock()
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0), window_size=2)
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=[monitor, wall], max_epochs=2,
                      num_sanity_val_steps=1, **quiet(logger=recorder, log_every_n_steps=1))  # fmt: skip
    trainer.fit(model, loader(n=2 * BATCH, batch_size=BATCH), loader(n=2 * BATCH, batch_size=BATCH))
    val = [(step, m) for step, m in recorder.calls if "validate/time" in m]
    # the sanity check is not measured; the step of an evaluation batch counts across validation runs
    assert [step for step, _ in val] == [1, 2, 3, 4]
    assert [m["validate/samples"] for _, m in val] == [BATCH, 2 * BATCH, BATCH, 2 * BATCH]  # reset per run
    assert "validate/device/samples_per_sec" in val[1][1] and "validate/device/samples_per_sec" not in val[2][1]
    train = [m for _, m in recorder.calls if "train/time" in m]
    assert [m["train/batches"] for m in train] == [1, 2, 3, 4]
    # between training batches 2 and 3 the first validation ran: the training clock leaves it out
    # (at least the logged validation time, which starts after the training batch ended)
    train_gap = train[2]["train/time"] - train[1]["train/time"]
    wall_gap = wall.times[2] - wall.times[1]
    assert 0 < train_gap <= wall_gap - val[1][1]["validate/time"] + 1e-3


@pytest.mark.parametrize(
    ("name", "chip"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", None),  # not an L4
        ("Tesla T4", "t4"),
        ("Tesla V100-SXM2-16GB", "v100-sxm"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_cuda_device_names_map_to_the_peak_table(name: str, chip: str | None) -> None:
    assert _cuda_chip(name) == chip
    if chip is not None:
        assert _CUDA_FLOPS[chip][torch.float32] > 0
