"""Shared fixtures: nothing may be left behind (``phalanx.testing.leaks``: processes, re-parented
ranks included, ports, environment variables), and the chained multi-process runs.

Each run costs real CPU time (4 processes on 2 cores), so the runs are session-scoped, each
script does several fits (and its plain-torch reference on the same ranks), and the tests only
read their outputs. The chain: a (2 x 2) run writes a distributed checkpoint after epoch 0 and a
consolidated file at the end; (4 x 1) and (1 x 2) runs resume from them. The context-parallel and
HSDP runs (``train_cp.py``) are one 2-process and one 4-process script.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mp_testing import DP_SCHEDULE_RUNS, SCHEDULE_RUNS, run_script

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind"]


def _train(out: Path, runs: list[dict[str, object]], timeout: float | None = None) -> Path:
    run_script("train.py", str(out), json.dumps(runs), **({} if timeout is None else {"timeout": timeout}))
    return out


@pytest.fixture(scope="session")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model_parallel_runs")


@pytest.fixture(scope="session")
def mesh_2x2(out_dir: Path) -> Path:
    """(2 dp x 2 tp), 2 epochs: DCP checkpoint after epoch 0, consolidated file at the end, reference."""
    run = {"tag": "t22", "dp": 2, "tp": 2, "save_epoch0": "ckpt22", "save_final_full": "full22.pt", "reference": "tp"}
    return _train(out_dir, [run])


@pytest.fixture(scope="session")
def mesh_4x1(mesh_2x2: Path) -> Path:
    """(4 x 1): resume epoch 1 from the (2 x 2) DCP checkpoint; load the consolidated file."""
    return _train(
        mesh_2x2,
        [
            {"tag": "r41", "dp": 4, "tp": 1, "resume": str(mesh_2x2 / "ckpt22")},
            {"tag": "full41", "dp": 4, "tp": 1, "resume": str(mesh_2x2 / "full22.pt")},
        ],
    )


@pytest.fixture(scope="session")
def mesh_1x2(mesh_2x2: Path) -> Path:
    """(1 x 2), 2 processes: training + reference, resume from (2 x 2), precisions, bad inputs."""
    common = {"devices": 2, "dp": 1, "tp": 2}
    return _train(
        mesh_2x2,
        [
            {**common, "tag": "t12", "reference": "tp"},
            {**common, "tag": "r12", "resume": str(mesh_2x2 / "ckpt22")},
            {**common, "tag": "bf16mixed", "epochs": 1, "precision": "bf16-mixed", "reference": "tp"},
            {**common, "tag": "bf16true", "epochs": 1, "precision": "bf16-true", "reference": "tp"},
            {**common, "tag": "mismatch", "model": "Net32", "resume": str(mesh_2x2 / "ckpt22"), "expect_error": True},
            {**common, "tag": "badtp", "model": "Net15", "expect_error": True},
            {**common, "tag": "noconf", "model": "NoConfigureModel", "expect_error": True},
        ],
    )


@pytest.fixture(scope="session")
def pipeline_2(out_dir: Path) -> Path:
    """(pp 2), 2 processes: GPipe (with validation, predict, a checkpoint) and 1F1B, references; bad stages."""
    common = {"devices": 2, "dp": 1, "tp": 1, "pp": 2}
    return _train(
        out_dir,
        [
            {
                **common,
                "tag": "pp_gpipe",
                "schedule": "gpipe",
                "reference": "pp",
                "validate": True,
                "predict": True,
                "save_final": "ckpt_pp",
            },
            {**common, "tag": "pp_1f1b", "schedule": "1f1b", "reference": "pp"},
            {**common, "tag": "nostages", "model": "NoStages", "expect_error": True},
            {**common, "tag": "uncovered", "model": "Uncovered", "expect_error": True},
        ],
    )


@pytest.fixture(scope="session")
def pipeline_schedules_2(out_dir: Path) -> Path:
    """(pp 2), 2 processes, one job: every schedule of SCHEDULE_RUNS for 4 batches (interleaved 1F1B and
    both ZB-V runs also validate and predict), then a model with too few blocks and a microbatch count
    DualPipeV refuses."""
    common = {"devices": 2, "dp": 1, "tp": 1, "pp": 2, "epochs": 1, "batches": 4, "micro": 4}
    checks = {"validate": True, "predict": True}
    runs: list[dict[str, object]] = [
        {**common, "tag": tag, "schedule": schedule, "model": model, "accumulate": accumulate, "checkpoint": ac}
        | (checks if tag in ("s_interleaved_1f1b", "s_zbv_zero_bubble", "s_zbv_checkpointed") else {})
        for tag, schedule, model, accumulate, ac in SCHEDULE_RUNS
    ]
    runs += [
        {**common, "tag": "fewblocks", "schedule": "zbv_zero_bubble", "model": "Blocks3", "expect_error": True},
        {**common, "tag": "fewmicro", "schedule": "dualpipe_v", "model": "Blocks4", "micro": 2, "expect_error": True},
    ]
    return _train(out_dir, runs)


@pytest.fixture(scope="session")
def pipeline_dp2_pp2(out_dir: Path) -> Path:
    """(dp 2 x pp 2), 4 processes, each stage fully_shard-ed over data parallel: 1F1B with its reference;
    then the V and the loop layout (DP_SCHEDULE_RUNS: ZB-V, Interleaved Zero Bubble with accumulation)."""
    common = {"devices": 4, "dp": 2, "tp": 1, "pp": 2}
    runs: list[dict[str, object]] = [{**common, "tag": "dp2pp2", "reference": "pp"}]
    short = {"model": "Blocks4", "epochs": 1, "batches": 4, "micro": 2}
    runs += [
        {**common, **short, "tag": tag, "schedule": schedule, "accumulate": accumulate}
        for tag, schedule, accumulate in DP_SCHEDULE_RUNS
    ]
    return _train(out_dir, runs, timeout=240)


@pytest.fixture(scope="session")
def context_parallel_2(out_dir: Path) -> Path:
    """(cp 2), 2 processes: the strategy shards the model (SDPA, then nn.MultiheadAttention); a model
    without SDPA; FSDP over the wrong mesh."""
    common = {"devices": 2, "cp": 2}
    runs = [
        {**common, "tag": "cp2", "model": "auto"},
        {**common, "tag": "cp2mha", "model": "mha"},
        {**common, "tag": "nosdpa", "model": "manual", "expect_error": True},
        {**common, "tag": "wrongmesh", "model": "wrongmesh", "expect_error": True},
    ]
    run_script("train_cp.py", str(out_dir), json.dumps(runs))
    return out_dir


@pytest.fixture(scope="session")
def context_parallel_4(out_dir: Path) -> Path:
    """4 processes: dp 2 x cp 2, tp 2 x cp 2, HSDP 2 x 2 (plain FSDP over 4 ranks after it), HSDP 2 x 1 x cp 2."""
    runs = [
        {"tag": "dp2cp2", "devices": 4, "dp": 2, "cp": 2},
        {"tag": "tp2cp2", "devices": 4, "dp": 1, "tp": 2, "cp": 2, "epochs": 1},
        {"tag": "hsdp", "devices": 4, "rep": 2, "shard": 2, "reference_fsdp": True},
        {"tag": "hsdpcp", "devices": 4, "rep": 2, "shard": 1, "cp": 2, "epochs": 1},
    ]
    run_script("train_cp.py", str(out_dir), json.dumps(runs), timeout=280)
    return out_dir
