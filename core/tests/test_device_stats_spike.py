"""DeviceStatsMonitor logs the accelerator's stats under Lightning's keys and cadence; SpikeDetection
raises on a scripted loss spike, writes the batches to skip, and with two ranks both ranks stop when
only one spikes.

The two-process test runs this file as a script (``python test_device_stats_spike.py OUT``) under the
core's own ParallelStrategy.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch import nn
from trainer_helpers import loader, quiet

from phalanx.accelerators.cpu import _stdlib_cpu_stats, get_cpu_stats
from phalanx.callbacks.device_stats_monitor import DeviceStatsMonitor
from phalanx.callbacks.spike_detection import SpikeDetection, TrainingSpikeException
from phalanx.errors import MisconfigurationError
from phalanx.loggers.logger import Logger
from phalanx.module import Module
from phalanx.testing.processes import Job
from phalanx.trainer.trainer import Trainer


class Recorder(Logger):
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


class Scripted(Module):
    """Returns ``losses[batch_idx]`` (per rank when ``per_rank`` is given) as the training loss."""

    def __init__(self, losses: Sequence[float], per_rank: dict[int, Sequence[float]] | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(6, 1)
        self.losses = list(losses)
        self.per_rank = per_rank or {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        values = self.per_rank.get(self.global_rank, self.losses)
        return self.layer(x).sum() * 0 + values[batch_idx]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


# ------------------------------------------------------------------ DeviceStatsMonitor
def _stats_fit(tmp_path: Path, monitor: DeviceStatsMonitor, **kwargs: Any) -> Recorder:
    recorder = Recorder()
    kwargs.setdefault("log_every_n_steps", 1)
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=[monitor], max_epochs=1,
                      **quiet(logger=recorder, enable_model_summary=False, **kwargs))  # fmt: skip
    trainer.fit(Scripted([1.0] * 4), loader(n=16))
    return recorder


def test_cpu_stats_are_logged_per_hook_at_every_step(tmp_path: Path) -> None:
    recorder = _stats_fit(tmp_path, DeviceStatsMonitor())
    prefix = "DeviceStatsMonitor.on_train_batch_start/"
    starts = [(step, m) for step, m in recorder.calls if any(k.startswith(prefix) for k in m)]
    ends = [
        step for step, m in recorder.calls if any(k.startswith("DeviceStatsMonitor.on_train_batch_end/") for k in m)
    ]
    assert [step for step, _ in starts] == [0, 1, 2, 3] and ends == [0, 1, 2, 3]
    for _, metrics in starts:
        assert {f"{prefix}cpu_percent", f"{prefix}cpu_vm_percent", f"{prefix}cpu_swap_percent"} <= set(metrics)
        assert 0 <= metrics[f"{prefix}cpu_vm_percent"] <= 100
    # the value is psutil's system-wide memory use (other processes move it a little)
    assert starts[-1][1][f"{prefix}cpu_vm_percent"] == pytest.approx(psutil.virtual_memory().percent, abs=5)


def test_cadence_filter_and_cpu_stats_off(tmp_path: Path) -> None:
    recorder = _stats_fit(tmp_path / "a", DeviceStatsMonitor(filter_keys={"cpu_percent"}), log_every_n_steps=2)
    assert [(step, sorted(m)) for step, m in recorder.calls] == [
        (1, ["DeviceStatsMonitor.on_train_batch_start/cpu_percent"]),
        (1, ["DeviceStatsMonitor.on_train_batch_end/cpu_percent"]),
        (3, ["DeviceStatsMonitor.on_train_batch_start/cpu_percent"]),
        (3, ["DeviceStatsMonitor.on_train_batch_end/cpu_percent"]),
    ]
    assert _stats_fit(tmp_path / "b", DeviceStatsMonitor(cpu_stats=False)).calls == []


def test_without_a_logger_is_an_error(tmp_path: Path) -> None:
    trainer = Trainer(
        accelerator="cpu", default_root_dir=tmp_path, callbacks=[DeviceStatsMonitor()], max_steps=1, **quiet()
    )
    with pytest.raises(MisconfigurationError, match="logger=False"):
        trainer.fit(Scripted([1.0]), loader(n=4))


def test_stdlib_fallback_agrees_with_psutil() -> None:
    fallback, with_psutil = _stdlib_cpu_stats(), get_cpu_stats()
    assert fallback["cpu_vm_percent"] == pytest.approx(with_psutil["cpu_vm_percent"], abs=5)
    assert fallback["cpu_swap_percent"] == pytest.approx(with_psutil["cpu_swap_percent"], abs=5)
    assert 0 <= fallback["cpu_percent"] <= 100 and fallback["peak_rss_bytes"] > 0


# ------------------------------------------------------------------ SpikeDetection
def _spike_fit(tmp_path: Path, losses: Sequence[float], **kwargs: Any) -> SpikeDetection:
    spike = SpikeDetection(**kwargs)
    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path, callbacks=[spike], max_epochs=1,
                      **quiet(enable_model_summary=False))  # fmt: skip
    trainer.fit(Scripted(losses), loader(n=4 * len(losses)))
    return spike


def test_a_spike_raises_and_writes_the_batches_to_skip(tmp_path: Path) -> None:
    with pytest.raises(TrainingSpikeException, match="Training spike detected in batch 3"):
        _spike_fit(tmp_path, [1.0, 0.9, 1.1, 5.0, 1.0])
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [2, 3]


def test_rising_within_tolerance_or_improving_is_not_a_spike(tmp_path: Path) -> None:
    # |2.9 - mean 1.0| = 1.9 stays under rtol x mean = 2.0; 0.5 is an improvement
    spike = _spike_fit(tmp_path, [1.0, 1.0, 2.9, 0.5], window=2)
    assert spike.bad_batches == [] and not (tmp_path / "skip_batches.json").exists()
    assert spike.running_mean == pytest.approx((2.9 + 0.5) / 2)  # the window keeps the last two


def test_atol_and_rtol_must_both_be_exceeded(tmp_path: Path) -> None:
    # |4 - 1| = 3 exceeds rtol x mean = 2 but not atol = 5
    _spike_fit(tmp_path / "a", [1.0, 1.0, 4.0], atol=5.0)
    with pytest.raises(TrainingSpikeException):
        _spike_fit(tmp_path / "b", [1.0, 1.0, 4.0], atol=2.5)


def test_max_mode_spikes_downwards(tmp_path: Path) -> None:
    _spike_fit(tmp_path / "a", [1.0, 1.0, 4.0], mode="max")  # an increase is an improvement
    with pytest.raises(TrainingSpikeException, match="batch 2"):
        _spike_fit(tmp_path / "b", [10.0, 10.0, -20.0], mode="max", exclude_batches_path=tmp_path / "b" / "x.json")
    assert json.loads((tmp_path / "b" / "x.json").read_text()) == [1, 2]


def test_non_finite_losses(tmp_path: Path) -> None:
    with pytest.raises(TrainingSpikeException, match="batch 2"):
        _spike_fit(tmp_path / "a", [1.0, 1.0, math.nan])
    # Without finite_only the usual comparison decides, as in Lightning: +inf is far above the mean...
    with pytest.raises(TrainingSpikeException, match="batch 2"):
        _spike_fit(tmp_path / "b", [1.0, 1.0, math.inf, 1.0], finite_only=False)
    # ... while NaN compares false (no spike) and is left out of the mean
    spike = _spike_fit(tmp_path / "c", [1.0, 1.0, math.nan, 1.0], finite_only=False)
    assert spike.bad_batches == [] and spike.running_mean == 1.0


def test_invalid_mode_names_the_choices() -> None:
    with pytest.raises(MisconfigurationError, match="'min' and 'max'"):
        SpikeDetection(mode="down")


@pytest.mark.timeout(150)
def test_one_rank_spiking_stops_both_ranks(tmp_path: Path) -> None:
    job = Job([sys.executable, __file__, str(tmp_path)], tmp_path, env={"OMP_NUM_THREADS": "1"}, warm=True)
    code = job.wait(timeout=120)
    assert code == 0, job.output()
    assert job.leftovers() == [], job.output()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks == [{"raised": "Training spike detected in batch 3", "global_step": 4}] * 2
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [2, 3]


def _rank_main(out: str) -> None:
    from phalanx.strategies import ParallelStrategy

    trainer = Trainer(accelerator="cpu", devices=2, strategy=ParallelStrategy(), callbacks=[SpikeDetection()],
                      default_root_dir=out, max_epochs=1, **quiet(enable_model_summary=False))  # fmt: skip
    calm = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    model = Scripted(calm, per_rank={1: [1.0, 1.0, 1.0, 9.0, 1.0, 1.0]})  # only rank 1 spikes, at batch 3
    record: dict[str, Any] = {"raised": None}
    try:
        trainer.fit(model, loader(n=48))
    except TrainingSpikeException as exc:
        record["raised"] = str(exc)
    record["global_step"] = trainer.global_step
    (Path(out) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    _rank_main(sys.argv[1])
