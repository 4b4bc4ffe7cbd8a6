"""The built-in callbacks and loggers together on two processes, under ddp and under fsdp.

``scripts/callbacks_matrix.py`` attaches EarlyStopping, LearningRateMonitor, ModelCheckpoint,
ThroughputMonitor, DeviceStatsMonitor, SpikeDetection, GradientAccumulationScheduler, ModelSummary
and a per-rank prediction writer to one Trainer with a TensorBoard and a CSV logger, fits a tiny
regression on two CPU processes (gloo) and predicts. Each callback's outcome is fixed in advance
(the validation score is scripted, the schedules are known), and the training itself is replayed
here in plain PyTorch: the weights, the checkpoints, the logged losses and the predictions must
match that replay. The logs are read back with TensorBoard's ``EventAccumulator`` and ``csv``.
Exactly one launch per strategy; each must finish well inside its timeout and leave no process.
"""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from phalanx.discovery import convert_checkpoint
from phalanx.testing.processes import run_command

SCRIPT = Path(__file__).parent / "scripts" / "callbacks_matrix.py"
#: Seconds the two-process run may take before it is killed and the test fails (it takes ~15 s).
RUN_TIMEOUT = 150.0
#: Lightning's CPU statistics (``get_cpu_stats``), logged under ``DeviceStatsMonitor.<hook>/<stat>``.
CPU_STATS = ("cpu_percent", "cpu_vm_percent", "cpu_swap_percent")
THROUGHPUT_KEYS = ("time", "batches", "samples", "device/batches_per_sec", "device/samples_per_sec", "batches_per_sec",
                   "samples_per_sec", "device/flops_per_sec", "flops_per_sec", "device/mfu", "mfu")  # fmt: skip


def _load_script() -> ModuleType:
    """The script as a module (its ``__main__`` block does not run), for its model, data and constants."""
    spec = importlib.util.spec_from_file_location("_callbacks_matrix_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(strategy: str, workdir: Path) -> tuple[dict[str, Any], str]:
    """Run the script as a user would; return rank 0's JSON and the job's output."""
    out = workdir / "result.json"
    args = ["--strategy", strategy, "--devices", "2", "--accelerator", "cpu", "--root", str(workdir), "--out", str(out)]
    result = run_command([str(SCRIPT), *args], cwd=workdir, logs=workdir, env={"OMP_NUM_THREADS": "1"}, timeout=RUN_TIMEOUT)
    output = result.output()
    assert result.returncode == 0, f"callbacks_matrix.py --strategy {strategy} exited with {result.returncode}\n{output[-8000:]}"
    result.check_leftovers()
    assert out.exists(), f"callbacks_matrix.py exited 0 but wrote no {out.name}\n{output[-4000:]}"
    return json.loads(out.read_text(encoding="utf-8")), output


@dataclass
class Replay:
    """What the run must have done, computed in plain PyTorch."""

    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    epoch_weights: list[dict[str, torch.Tensor]] = field(default_factory=list)
    #: Per rank, the loss of every training batch, in order.
    losses: list[list[float]] = field(default_factory=lambda: [[], []])
    #: Optimizer steps done before each training batch, and at the start / end of each epoch.
    steps_before_batch: list[int] = field(default_factory=list)
    epoch_start_steps: list[int] = field(default_factory=list)
    epoch_end_steps: list[int] = field(default_factory=list)
    #: Cumulative batch count of each batch that ended an accumulation window (an optimizer step).
    stepping_batches: list[int] = field(default_factory=list)
    params: int = 0
    #: The network with the final weights.
    net: torch.nn.Module | None = None


def _replay(script: ModuleType, world: int = 2) -> Replay:
    """DDP by hand: rank r reads samples r, r+2, ... in order; each window's gradient is the mean
    over ranks of the sum over its batches of grad(loss / factor) (Lightning divides by the factor
    even in an epoch's last, incomplete window); SGD steps with StepLR's rate for the epoch."""
    net = script.make_net()
    replay = Replay(params=sum(p.numel() for p in net.parameters()))
    x, y = script.regression_data(script.TRAIN_SAMPLES, seed=1).tensors
    shards = [list(range(rank, script.TRAIN_SAMPLES, world)) for rank in range(world)]
    batches = [[shard[i : i + script.BATCH] for i in range(0, len(shard), script.BATCH)] for shard in shards]
    steps = seen = 0
    for epoch in range(script.STOP_EPOCH + 1):
        factor = script.ACCUMULATION[max(key for key in script.ACCUMULATION if key <= epoch)]
        lr = script.LR * script.GAMMA**epoch
        replay.epoch_start_steps.append(steps)
        for index in range(len(batches[0])):
            replay.steps_before_batch.append(steps)
            seen += 1
            for rank in range(world):
                rows = batches[rank][index]
                loss = F.mse_loss(net(x[rows]), y[rows])
                replay.losses[rank].append(float(loss.detach()))
                (loss / factor / world).backward()  # .grad sums the ranks: their mean, as DDP all-reduces
            if (index + 1) % factor == 0 or index == len(batches[0]) - 1:
                with torch.no_grad():
                    for param in net.parameters():
                        param -= lr * param.grad
                        param.grad = None
                steps += 1
                replay.stepping_batches.append(seen)
        replay.epoch_end_steps.append(steps)
        # keys as the Module names them (its network is ``self.net``)
        replay.epoch_weights.append({f"net.{k}": v.detach().clone() for k, v in net.state_dict().items()})
    replay.weights = replay.epoch_weights[-1]
    replay.net = net
    return replay


def _spikes(losses: list[float], per_epoch: int, window: int = 10, rtol: float = 2.0) -> list[int]:
    """SpikeDetection's documented rule with its defaults (warmup 1, atol None), on one rank's losses."""
    found: list[int] = []
    recent: list[float] = []
    last = 0.0
    for index, value in enumerate(losses):
        mean = sum(recent[-window:]) / len(recent[-window:]) if recent else math.nan
        if index % per_epoch >= 1 and value > last and abs(value - mean) >= abs(rtol * mean):
            found.append(index)
        recent.append(value)
        last = value
    return found


def _assert_close(got: Any, expected: torch.Tensor, what: str, atol: float = 1e-6) -> None:
    got = torch.as_tensor(got, dtype=expected.dtype)
    assert torch.allclose(got, expected, rtol=1e-5, atol=atol), f"{what}: {got} != {expected}"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_callbacks_and_loggers_on_two_ranks(strategy: str, tmp_path: Path) -> None:
    script = _load_script()
    replay = _replay(script)
    per_epoch = len(replay.losses[0]) // (script.STOP_EPOCH + 1)
    assert _spikes(replay.losses[0], per_epoch) == _spikes(replay.losses[1], per_epoch) == []  # the premise
    result, output = _run(strategy, tmp_path)
    views = [json.loads((tmp_path / f"rank{rank}.json").read_text(encoding="utf-8")) for rank in range(2)]
    end_step = replay.epoch_end_steps[-1]
    best_k = {f"epoch={epoch}-step={replay.epoch_end_steps[epoch]}.ckpt": script.SCORES[epoch] for epoch in (1, 2)}

    for rank, view in enumerate(views):
        summary = {key: value for key, value in view.items() if key != "weights"}
        where = f"{strategy}, rank {rank}: {summary}"
        # EarlyStopping(min_delta=0.5, patience=1): epoch 2 improves by only 0.2, so fit stops there on both ranks
        assert (view["world_size"], view["stopped_epoch"], view["should_stop"]) == (2, script.STOP_EPOCH, True), where
        assert view["current_epoch"] == script.STOP_EPOCH + 1, where
        assert view["early_stopping_best"] == pytest.approx(script.SCORES[1]), where
        # GradientAccumulationScheduler({0: 1, 1: 2}): 3 steps in epoch 0, then 2 per epoch (2 + 1 batches)
        assert (view["global_step"], view["accumulate_grad_batches"]) == (end_step, 2), where
        assert view["lrs"] == {"lr-SGD": pytest.approx([script.LR * script.GAMMA**e for e in range(3)])}, where
        # ModelCheckpoint(save_top_k=2): the two lowest synced scores (epochs 1 and 2; epoch 0's file removed)
        assert view["best_k_models"] == pytest.approx(best_k), where
        assert view["best_model_score"] == pytest.approx(script.SCORES[2]), where
        assert Path(view["best_model_path"]).name == f"epoch=2-step={end_step}.ckpt", where
        assert Path(view["last_model_path"]).name == "last.ckpt", where
        assert view["bad_batches"] == [], where  # SpikeDetection saw no spike
        assert view["returned_rows"] == len(range(rank, script.PREDICT_SAMPLES, 2)), where
        for name, expected in replay.weights.items():  # the final weights (FSDP's gathered) are the replay's
            _assert_close(view["weights"][name], expected, f"{strategy} rank {rank} final {name}")
    assert not (tmp_path / "skip_batches.json").exists()

    _check_checkpoints(Path(result["checkpoint_dir"]), replay, tmp_path, strategy)
    _check_tensorboard(result["tensorboard_dir"], script, replay)
    _check_csv(Path(result["csv_dir"]), script, replay)
    _check_predictions(tmp_path, script, replay)
    # only global rank 0 logs: one version folder per logger
    assert sorted(os.listdir(tmp_path / "tb")) == sorted(os.listdir(tmp_path / "csv")) == ["version_0"]
    # ModelSummary on rank 0 only, counting the whole model (FSDP: not the local shard)
    total = rf"^(?:\[rank \d+\] )?{replay.params}\s+Total params$"  # rank 1's lines would carry a prefix
    assert len(re.findall(total, output, flags=re.MULTILINE)) == 1, output[-3000:]


def _check_checkpoints(folder: Path, replay: Replay, tmp_path: Path, strategy: str) -> None:
    """The kept checkpoints hold the weights of the epochs they are named after (FSDP: sharded folders)."""
    end = replay.epoch_end_steps
    expected = {f"epoch=1-step={end[1]}.ckpt": 1, f"epoch=2-step={end[2]}.ckpt": 2, "last.ckpt": 2}
    assert sorted(os.listdir(folder)) == sorted(expected), os.listdir(folder)
    for name, epoch in expected.items():
        portable = tmp_path / "portable" / name
        convert_checkpoint(str(folder / name), str(portable))
        state = torch.load(portable, weights_only=True)["state_dict"]
        for key, value in replay.epoch_weights[epoch].items():
            _assert_close(state[key], value, f"{strategy} {name} {key}")


def _scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _check_tensorboard(log_dir: str, script: ModuleType, replay: Replay) -> None:
    scalars = _scalars(log_dir)
    # LearningRateMonitor: StepLR's rate at each epoch start, at the steps done so far
    lrs = [(step, script.LR * script.GAMMA**epoch) for epoch, step in enumerate(replay.epoch_start_steps)]
    assert [s for s, _ in scalars["lr-SGD"]] == [s for s, _ in lrs], scalars["lr-SGD"]
    assert [v for _, v in scalars["lr-SGD"]] == pytest.approx([v for _, v in lrs]), scalars["lr-SGD"]
    # the synced score, at Lightning's step: validation runs before the epoch's last step is counted
    val = scalars["val_score"]
    assert [s for s, _ in val] == [step - 1 for step in replay.epoch_end_steps], val
    assert [v for _, v in val] == pytest.approx(list(script.SCORES[: script.STOP_EPOCH + 1])), val
    # train_loss (on_step): rank 0's own loss of each batch that stepped, at the step before it
    stepped_losses = [replay.losses[0][batch - 1] for batch in replay.stepping_batches]
    assert [s for s, _ in scalars["train_loss"]] == list(range(len(stepped_losses))), scalars["train_loss"]
    assert [v for _, v in scalars["train_loss"]] == pytest.approx(stepped_losses, abs=1e-5), scalars["train_loss"]
    # ThroughputMonitor: logged when an accumulation window ends, counting every batch read so far
    assert [v for _, v in scalars["train/batches"]] == replay.stepping_batches, scalars["train/batches"]
    for key in THROUGHPUT_KEYS:
        assert f"train/{key}" in scalars, sorted(scalars)
    assert "predict/device/samples_per_sec" in scalars, sorted(scalars)
    # DeviceStatsMonitor: every training batch, before and after, at the steps done before its own step
    for hook in ("on_train_batch_start", "on_train_batch_end"):
        for stat in CPU_STATS:
            logged = scalars[f"DeviceStatsMonitor.{hook}/{stat}"]
            assert [s for s, _ in logged] == replay.steps_before_batch, (hook, stat, logged)
            assert all(0.0 <= v <= 100.0 for _, v in logged), logged
    for hook in ("on_validation_batch_start", "on_validation_batch_end"):
        for stat in CPU_STATS:
            # one validation batch per rank per epoch, logged where the validation metrics are (Lightning's
            # count of batches that stepped: the epoch's last step is not counted yet)
            logged = scalars[f"DeviceStatsMonitor.{hook}/{stat}"]
            assert [s for s, _ in logged] == [s for s, _ in scalars["val_score"]], (hook, logged)


def _csv_rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "metrics.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _column(rows: list[dict[str, str]], key: str) -> list[dict[str, float]]:
    """Rows that have ``key``, as floats (empty cells dropped)."""
    return [{k: float(v) for k, v in row.items() if v} for row in rows if row.get(key)]


def _check_csv(folder: Path, script: ModuleType, replay: Replay) -> None:
    """The same values in the CSV, at full precision: the throughput arithmetic is checked here."""
    rows = _csv_rows(folder)
    val = [row["val_score"] for row in _column(rows, "val_score")]
    assert val == pytest.approx(list(script.SCORES[: script.STOP_EPOCH + 1])), val
    lrs = [row["lr-SGD"] for row in _column(rows, "lr-SGD")]
    assert lrs == pytest.approx([script.LR * script.GAMMA**e for e in range(script.STOP_EPOCH + 1)]), lrs
    for stage, batch_sizes in (("train", None), ("predict", (3, 3))):
        logged = _column(rows, f"{stage}/time")
        batches = [int(row[f"{stage}/batches"]) for row in logged]
        samples = [row[f"{stage}/samples"] for row in logged]
        if batch_sizes is None:
            assert batches == replay.stepping_batches, batches
            assert samples == [script.BATCH * b for b in batches], samples
        else:  # rank 0 predicts samples 0, 2, ..., 10 in batches of 3
            assert (batches, samples) == ([1, 2], [3.0, 6.0]), (batches, samples)
        rated = [row for row in logged if f"{stage}/device/samples_per_sec" in row]
        assert len(rated) == len(logged) - 1, logged  # a window of 2 has rates from its second update on
        for row in rated:
            device = row[f"{stage}/device/samples_per_sec"]
            assert row[f"{stage}/samples_per_sec"] == pytest.approx(2 * device), row  # world size 2
            assert row[f"{stage}/device/flops_per_sec"] == pytest.approx(
                script.FLOPS_PER_BATCH * row[f"{stage}/device/batches_per_sec"]
            ), row
            assert row[f"{stage}/mfu"] == pytest.approx(row[f"{stage}/device/mfu"]), row
        batches_key, samples_key, time_key = f"{stage}/batches", f"{stage}/samples", f"{stage}/time"
        pairs = [(a, b) for a, b in itertools.pairwise(logged) if b[batches_key] - a[batches_key] == 1]
        assert pairs, logged
        for before, after in pairs:  # consecutive updates: the window's rate is samples / time between them
            rate = (after[samples_key] - before[samples_key]) / (after[time_key] - before[time_key])
            assert after[f"{stage}/device/samples_per_sec"] == pytest.approx(rate, rel=1e-9), (before, after)
    for hook in ("on_train_batch_start", "on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end"):
        for stat in CPU_STATS:
            assert _column(rows, f"DeviceStatsMonitor.{hook}/{stat}"), (hook, stat, list(rows[0]))


def _check_predictions(folder: Path, script: ModuleType, replay: Replay) -> None:
    """The ranks' files cover the predict set once, with the final model's outputs."""
    assert replay.net is not None
    with torch.no_grad():
        expected = replay.net(script.predict_inputs())
    covered: list[int] = []
    for rank in range(2):
        lines = [json.loads(line) for line in (folder / f"batches_rank{rank}.jsonl").read_text().splitlines()]
        indices = [i for line in lines for i in line["indices"]]
        predictions = [p for line in lines for p in line["predictions"]]
        _assert_close(predictions, expected[indices], f"rank {rank} batch-written predictions", atol=1e-5)
        epoch = torch.load(folder / f"epoch_rank{rank}.pt", weights_only=True)
        assert [i for batch in epoch["batch_indices"][0] for i in batch] == indices, (epoch, indices)
        _assert_close(torch.cat(epoch["predictions"]), expected[indices], f"rank {rank} epoch predictions", 1e-5)
        covered += indices
    assert sorted(covered) == list(range(script.PREDICT_SAMPLES)), covered  # each sample once, no padding
