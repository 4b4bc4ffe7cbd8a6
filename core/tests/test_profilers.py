"""Profilers record real time, real Python calls and real torch operators, and report them as
Lightning does: to stdout on rank 0, or to ``dirpath/<stage>-<filename>.txt``."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from trainer_helpers import Net, loader, quiet

from phalanx.errors import MisconfigurationError
from phalanx.profilers import (
    AdvancedProfiler,
    PassThroughProfiler,
    Profiler,
    PyTorchProfiler,
    SimpleProfiler,
    resolve_profiler,
)
from phalanx.trainer.trainer import Trainer


# ---------------------------------------------------------------------------------------- simple
def test_simple_profiler_records_the_time_actions_take() -> None:
    profiler = SimpleProfiler()
    profiler.setup(stage="fit")
    for _ in range(2):
        with profiler.profile("[Module]Net.training_step") as name:
            assert name == "[Module]Net.training_step"
            time.sleep(0.05)
    with profiler.profile("run_training_epoch"):
        time.sleep(0.02)

    steps = profiler.recorded_durations["[Module]Net.training_step"]
    assert len(steps) == 2
    assert all(d >= 0.05 for d in steps)
    assert sum(profiler.recorded_durations["run_training_epoch"]) >= 0.02
    report = profiler.summary()
    assert report.startswith("FIT Profiler Report")
    for text in ("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %", "Total"):
        assert text in report
    lines = [line for line in report.splitlines() if "[Module]Net.training_step" in line]
    assert len(lines) == 1
    assert lines[0].split("|")[3].strip() == "2"  # num calls
    # sorted by share of time: the step (0.1 s) before the epoch (0.02 s)
    assert report.index("[Module]Net.training_step") < report.index("run_training_epoch")


def test_simple_profiler_short_table_and_misuse() -> None:
    profiler = SimpleProfiler(extended=False)
    with profiler.profile("slow"):
        time.sleep(0.03)
    with profiler.profile("fast"):
        pass
    report = profiler.summary()
    assert report.startswith("Profiler Report")
    assert "Num calls" not in report
    assert report.index("slow") < report.index("fast")  # sorted by mean duration
    profiler.start("x")
    with pytest.raises(ValueError, match="already started"):
        profiler.start("x")
    with pytest.raises(ValueError, match="never started"):
        profiler.stop("y")


def test_describe_writes_the_report_to_dirpath(tmp_path: Path) -> None:
    profiler = SimpleProfiler(dirpath=tmp_path / "out", filename="perf")
    profiler.setup(stage="fit", local_rank=None)
    with profiler.profile("run_training_batch"):
        time.sleep(0.01)
    profiler.describe()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["fit-perf.txt"]
    text = (tmp_path / "out" / "fit-perf.txt").read_text()
    assert "FIT Profiler Report" in text and "run_training_batch" in text

    # a later stage appends to its own file; a rank in a multi-process run goes into the name
    profiler.setup(stage="validate", local_rank=1, log_dir=str(tmp_path / "ignored"))
    with profiler.profile("[Module]Net.validation_step"):
        pass
    profiler.describe()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fit-perf.txt", "validate-perf-1.txt"]
    assert "VALIDATE Profiler Report" in (tmp_path / "out" / "validate-perf-1.txt").read_text()


def test_dirpath_defaults_to_the_log_dir(tmp_path: Path) -> None:
    profiler = SimpleProfiler(filename="perf")
    profiler.setup(stage="test", local_rank=None, log_dir=str(tmp_path))
    with profiler.profile("a"):
        pass
    profiler.describe()
    assert (tmp_path / "test-perf.txt").exists()


def test_describe_prints_on_local_rank_zero_only(capsys: pytest.CaptureFixture[str]) -> None:
    for rank in (0, 1):
        profiler = SimpleProfiler()
        profiler.setup(stage="fit", local_rank=rank)
        with profiler.profile(f"action-of-rank-{rank}"):
            pass
        profiler.describe()
    out = capsys.readouterr().out
    assert "action-of-rank-0" in out
    assert "action-of-rank-1" not in out


def test_a_custom_profiler_needs_only_start_and_stop() -> None:
    class Counting(Profiler):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[str] = []

        def start(self, action_name: str) -> None:
            self.events.append(f"+{action_name}")

        def stop(self, action_name: str) -> None:
            self.events.append(f"-{action_name}")

    profiler = Counting()
    with pytest.raises(RuntimeError), profiler.profile("a"):
        raise RuntimeError
    assert profiler.events == ["+a", "-a"]  # stopped even when the action raised
    assert profiler.summary() == ""


# ---------------------------------------------------------------------------------------- advanced
def busy_function_inside_the_action() -> int:
    return sum(range(20_000))


def called_after_the_inner_action() -> int:
    return sum(range(1_000))


def test_advanced_profiler_reports_the_functions_an_action_called(tmp_path: Path) -> None:
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="adv", dump_stats=True)
    profiler.setup(stage="fit", local_rank=None)
    with profiler.profile("run_training_batch"):
        with profiler.profile("[Module]Net.training_step"):
            busy_function_inside_the_action()
        called_after_the_inner_action()  # the outer action's profile resumed after the inner one
    report = profiler.summary()
    assert report.startswith("FIT Profiler Report")
    outer, inner = report.split("Profile stats for: [Module]Net.training_step")
    assert "Profile stats for: run_training_batch" in outer
    assert "called_after_the_inner_action" in outer and "busy_function_inside_the_action" not in outer
    assert "busy_function_inside_the_action" in inner and "called_after_the_inner_action" not in inner
    assert "cumulative" in inner  # pstats' table
    prof_files = sorted(p.name for p in tmp_path.glob("*.prof"))
    assert prof_files == ["fit-adv-[Module]Net.training_step.prof", "fit-adv-run_training_batch.prof"]
    profiler.describe()
    assert "busy_function_inside_the_action" in (tmp_path / "fit-adv.txt").read_text()
    assert profiler.profiled_actions == {}  # describe tears down
    with pytest.raises(ValueError, match="never started"):
        profiler.stop("unknown")


def test_advanced_profiler_pickles_its_configuration() -> None:
    profiler = AdvancedProfiler(filename="x", line_count_restriction=5)
    with profiler.profile("a"):
        busy_function_inside_the_action()
    copy = pickle.loads(pickle.dumps(profiler))
    assert (copy.filename, copy.line_count_restriction, copy.profiled_actions) == ("x", 5, {})
    profiler.teardown(stage=None)


# ---------------------------------------------------------------------------------------- pytorch
def test_pytorch_profiler_reports_the_operators_run_inside(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="torch", table_kwargs={"max_name_column_width": 100})
    profiler.setup(stage="fit", local_rank=None)
    with profiler.profile("[Strategy]SingleDeviceStrategy.training_step"):
        torch.mm(torch.randn(16, 16), torch.randn(16, 16))
        model(torch.randn(4, 8))
    report = profiler.summary()
    assert report.startswith("FIT Profiler Report")
    assert "aten::mm" in report
    assert "[pl][profile][Strategy]SingleDeviceStrategy.training_step" in report
    assert "[pl][module]torch.nn.modules.linear.Linear" in report  # record_module_names
    traces = list(tmp_path.glob("fit-torch.pt.trace.json"))
    assert len(traces) == 1 and "aten::mm" in traces[0].read_text()
    profiler.describe()  # already stopped: reports the same events, no error
    assert "aten::mm" in (tmp_path / "fit-torch.txt").read_text()


def test_pytorch_profiler_describe_writes_the_table(tmp_path: Path) -> None:
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="t", export_to_chrome=False, row_limit=5)
    profiler.setup(stage="test", local_rank=None)
    with profiler.profile("[Module]Net.test_step"):
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    profiler.describe()
    assert "aten::mm" in (tmp_path / "test-t.txt").read_text()
    assert not list(tmp_path.glob("*.json"))
    assert profiler.profiler is None  # stopped


def test_pytorch_profiler_steps_a_given_schedule() -> None:
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    profiler = PyTorchProfiler(schedule=schedule, export_to_chrome=False)
    for step in range(6):
        with profiler.profile("[Module]Net.training_step"):
            torch.full((4, 4), float(step)).mm(torch.ones(4, 4))
    report = profiler.summary()
    row = next(line for line in report.splitlines() if line.strip().startswith("aten::mm "))
    assert row.split()[-1] == "2"  # only the two active steps were recorded


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sort_by_key": "speed"}, "sort_by_key='speed'"),
        ({"not_a_torch_arg": 1}, "not_a_torch_arg"),
        ({"table_kwargs": {"row_limit": 3}}, "row_limit"),
        ({"schedule": 3}, "schedule=3"),
    ],
)
def test_pytorch_profiler_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MisconfigurationError, match=match):
        PyTorchProfiler(**kwargs)


# ---------------------------------------------------------------------------------------- resolve
def test_resolve_profiler_maps_trainer_values() -> None:
    assert isinstance(resolve_profiler(None), PassThroughProfiler)
    assert isinstance(resolve_profiler("simple"), SimpleProfiler)
    assert isinstance(resolve_profiler("Advanced"), AdvancedProfiler)
    assert isinstance(resolve_profiler("pytorch"), PyTorchProfiler)
    mine = SimpleProfiler(extended=False)
    assert resolve_profiler(mine) is mine


@pytest.mark.parametrize("value", ["simpel", 3, SimpleProfiler])
def test_resolve_profiler_rejects_anything_else(value: Any) -> None:
    with pytest.raises(MisconfigurationError) as info:
        resolve_profiler(value)
    message = str(info.value)
    assert repr(value) in message and "'advanced'" in message and "Profiler" in message
    if value == "simpel":
        assert "did you mean 'simple'" in message


@pytest.mark.timing
def test_pass_through_profiler_does_nothing_cheaply() -> None:
    profiler = PassThroughProfiler()
    assert profiler.profile("a") is profiler.profile("b")  # one shared context, no allocation
    with profiler.profile("a"):
        pass
    assert profiler.summary() == ""
    start = time.perf_counter()
    for _ in range(100_000):
        with profiler.profile("[Callback]X.on_train_batch_end"):
            pass
    assert (time.perf_counter() - start) / 100_000 < 5e-6


# ---------------------------------------------------------------------------------------- with a Trainer
class _SleepyNet(Net):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


def test_trainer_profiles_its_loop_and_writes_the_report(tmp_path: Path) -> None:
    profiler = SimpleProfiler(dirpath=tmp_path, filename="perf")
    trainer = Trainer(max_epochs=1, limit_train_batches=3, profiler=profiler, **quiet())
    trainer.fit(_SleepyNet(), loader())
    reports = list(tmp_path.glob("fit-perf*.txt"))
    assert len(reports) == 1
    text = reports[0].read_text()
    for action in ("run_training_epoch", "run_training_batch", "training_step"):
        assert action in text
    steps = [d for name, d in profiler.recorded_durations.items() if name == "[Strategy]SingleDeviceStrategy.training_step"]
    assert steps and len(steps[0]) == 3 and min(steps[0]) >= 0.02
