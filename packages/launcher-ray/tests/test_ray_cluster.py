"""Trainers on a real local Ray cluster (127.0.0.1, 2 CPUs): parity with torchrun, checkpoints, a kill -9.

One cluster serves the module (starting one costs seconds on 2 cores), and one TorchTrainer run
(``scripts/ray_parity.py``) trains the same Module under ddp, fsdp and the example vendor
strategy (local_sgd), unchanged user code in a training function, which several tests then read.
The reference is plain PyTorch under torchrun (``scripts/torchrun_reference.py``): DDP, FSDP2 and
local SGD on the same data. Ray Train makes the process group; nothing here mocks Ray or
torch.distributed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from ray_case import STEPS
from ray_cluster_testing import SCRIPTS, LocalRayCluster

from phalanx.testing.processes import Job, run_command

#: One Ray Train run's limit: a worker group starts in about 10 s on 2 idle cores.
RUN_TIMEOUT = 150.0
#: The first test of the module also pays for the cluster, the reference and the parity run.
FIRST_TIMEOUT = 300
ATOL = 1e-6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    ray_cluster = LocalRayCluster(tmp_path_factory.mktemp("ray-head"))
    try:
        yield ray_cluster
    finally:
        leftovers = ray_cluster.stop()
    assert not leftovers, f"stopping the Ray cluster left processes running (killed now):\n{leftovers}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plain PyTorch DDP, FSDP2 and local SGD on 2 torchrun ranks: OUT/torchrun_<name>.pt."""
    out = tmp_path_factory.mktemp("reference")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(SCRIPTS / "torchrun_reference.py"), str(out)]  # fmt: skip
    run_command(command, cwd=SCRIPTS, env={"OMP_NUM_THREADS": "1"}, timeout=RUN_TIMEOUT).check()
    return out


@pytest.fixture(scope="module")
def parity_run(cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/ray_parity.py on the cluster: 2 workers, ddp then fsdp then local_sgd."""
    out = tmp_path_factory.mktemp("parity")
    run_command([str(SCRIPTS / "ray_parity.py"), str(out)], cwd=SCRIPTS, env=cluster.driver_env(),
                timeout=RUN_TIMEOUT).check()  # fmt: skip
    return out


def _assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        difference = (got[name] - tensor).abs().max().item()
        assert difference <= ATOL, f"{name}: differs by {difference:.3g} (> {ATOL:g})"


def _workers(parity_run: Path) -> dict:
    return json.loads((parity_run / "workers.json").read_text())


@pytest.mark.timeout(FIRST_TIMEOUT)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "local_sgd"])
def test_two_workers_match_plain_torchrun(strategy: str, parity_run: Path, reference: Path) -> None:
    """Trainer(strategy=name) in a TorchTrainer function: the same final weights as plain torchrun.

    local_sgd is examples/vendor-strategy, a third-party package: any installed strategy runs.
    """
    workers = _workers(parity_run)
    assert workers["ray_group_before"] and workers["master_addr"] == "127.0.0.1"  # Ray's group, on loopback
    seen = workers[strategy]
    assert seen["environment"] == "RayEnvironment"  # detected: the function passes no plugins=[...]
    assert (seen["world_size"], seen["global_rank"]) == (2, 0)
    assert seen["rays_process_group"], "the Trainer did not train on (or did not leave) Ray Train's process group"
    _assert_same(torch.load(parity_run / f"ray_{strategy}.pt"), torch.load(reference / f"torchrun_{strategy}.pt"))


@pytest.mark.timeout(FIRST_TIMEOUT)
def test_devices_that_disagree_with_the_workers_name_both(parity_run: Path) -> None:
    message = _workers(parity_run)["mismatch_error"]
    assert message is not None, "Trainer(devices=1) under 2 Ray Train workers did not fail"
    assert "Trainer(devices=1, num_nodes=1) asks for 1 process" in message
    assert "Ray Train started 2 workers (ScalingConfig(num_workers=2)" in message
    assert "Fix: pass devices=2" in message


@pytest.mark.timeout(FIRST_TIMEOUT)
def test_every_checkpoint_reaches_ray_as_written(parity_run: Path) -> None:
    """ddp's files and fsdp's DCP directories are reported as they are, once per save, in order."""
    run = json.loads((parity_run / "run.json").read_text())
    kept = run["checkpoints"]
    steps = [(c["metrics"]["step"], c["entries"]) for c in kept]
    # every 4 steps of 12, for each of the 3 Trainers; each Ray checkpoint holds the newest file: last.ckpt
    assert steps == [(s, ["last.ckpt"]) for s in (4, 8, 12)] * 3, steps
    by_strategy = {"ddp": kept[2], "fsdp": kept[5], "local_sgd": kept[8]}
    for name, checkpoint in by_strategy.items():
        copied = Path(checkpoint["path"]) / "last.ckpt"
        written = Path(_workers(parity_run)[name]["last"])
        if name == "fsdp":  # a DCP directory: the same files, byte for byte
            assert copied.is_dir() and written.is_dir()
            files = sorted(p.relative_to(written) for p in written.rglob("*") if p.is_file())
            assert files == sorted(p.relative_to(copied) for p in copied.rglob("*") if p.is_file())
            assert any(str(f).endswith(".distcp") for f in files), files
            assert all((copied / f).read_bytes() == (written / f).read_bytes() for f in files)
        else:
            assert copied.is_file() and copied.read_bytes() == written.read_bytes()
    assert run["final"] == kept[-1]["path"]
    assert not list((parity_run / "ddp" / "checkpoints").glob(".ray-report-*")), "a staging folder was left behind"


@pytest.mark.timeout(FIRST_TIMEOUT + RUN_TIMEOUT)
def test_worker_killed_mid_fit_restarts_and_ends_with_the_uninterrupted_weights(
    cluster: LocalRayCluster, reference: Path, tmp_path: Path
) -> None:
    """phalanx_ray.fit(max_failures=1); rank 1 is SIGKILLed before step 7; Ray restarts both workers,
    which resume from Ray's latest checkpoint and end where plain DDP ends."""
    job = Job([str(SCRIPTS / "ray_restart.py"), str(tmp_path)], tmp_path, env=cluster.driver_env(), cwd=SCRIPTS,
              name="driver")  # fmt: skip
    try:
        pid_file = tmp_path / "worker.pid"
        deadline = time.monotonic() + RUN_TIMEOUT
        while not pid_file.exists():  # the worker writes it when it reaches step 7
            assert job.poll() is None, f"the run ended before its worker reached step 7:\n{job.output()[-6000:]}"
            assert time.monotonic() < deadline, f"no worker reached step 7 in {RUN_TIMEOUT:g}s:\n{job.output()[-6000:]}"
            time.sleep(0.05)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        code = job.wait(RUN_TIMEOUT)
    finally:
        job.kill_leftovers()
    assert code == 0, job.output()[-6000:]
    assert not job.leftovers(), "the driver left processes behind"
    first, second = (tmp_path / "starts_rank1.txt").read_text().splitlines()
    assert first == "None"  # the first attempt started from scratch ...
    resumed = Path(second)  # ... the second from Ray's copy of a checkpoint written before the kill
    assert resumed.name == "last.ckpt" and (tmp_path / "ray_results" / "restart") in resumed.parents, second
    # Ray registers a report when its controller collects it: step 6's, made just before the kill,
    # may still have been on its way, and then the restart resumes from step 4's.
    assert torch.load(resumed, weights_only=True)["global_step"] in (4, 6)
    # ckpt_path="last" in a hand-written training function sees the same checkpoint: RayEnvironment
    # answers Ray's latest report (nothing on the first attempt).
    assert (tmp_path / "kept_rank1.txt").read_text().splitlines() == ["None", second]
    final = torch.load(tmp_path / "final.pt")
    _assert_same(final, torch.load(reference / "torchrun_ddp.pt"))
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["metrics"]["step"] == STEPS
    reported = torch.load(result["checkpoint"], weights_only=True)["state_dict"]
    _assert_same({k.removeprefix("layers."): v for k, v in reported.items()}, final)
