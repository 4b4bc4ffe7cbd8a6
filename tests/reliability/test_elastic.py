"""Elastic world size: a node is lost after a checkpoint, torchrun restarts the survivor on one node.

Two torchrun agents ("nodes", one process each) meet through a c10d rendezvous on loopback and
train FSDP on 2 ranks. After the step-3 checkpoint (mid-epoch) one node is killed as a whole
(agent and worker, SIGKILL: a lost machine). The survivor's next collective fails, its agent
restarts it, the new rendezvous admits one node, and ``fit(ckpt_path="last")`` resumes the sharded
checkpoint on world size 1: weights and optimizer state resharded, the rest of the epoch's samples
regrouped. The final weights are compared with plain PyTorch doing the same schedule, computed
here: 2 ranks for 3 steps, then 1 rank on the samples the first 3 steps did not read.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from rel_common import BATCH, build_layers, dataset
from reliability_helpers import SCRIPTS, free_port, job_env, run_job
from torch import nn
from torch.utils.data import DistributedSampler

from phalanx.testing.processes import Job

LR, MOMENTUM, CHECKPOINT_STEP = 0.1, 0.9, 3
#: Measured figures land here for the docs (one JSON line).
FIGURES = os.environ.get("PHALANX_RELIABILITY_FIGURES")


def reference_weights() -> dict[str, torch.Tensor]:
    """Plain torch: SGD+momentum, 3 steps averaged over 2 ranks' shards, then 1 rank on the unread rest."""
    net = build_layers()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    data = dataset()
    x, y = data.tensors

    def step(groups: list[list[int]]) -> None:
        optimizer.zero_grad()
        loss = sum(nn.functional.mse_loss(net(x[g]), y[g]) for g in groups) / len(groups)
        loss.backward()  # type: ignore[union-attr]
        optimizer.step()

    shards = [list(DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=0)) for rank in range(2)]
    read: set[int] = set()
    for k in range(CHECKPOINT_STEP):
        groups = [shard[k * BATCH : (k + 1) * BATCH] for shard in shards]
        step(groups)
        read.update(i for g in groups for i in g)
    one = list(DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0))
    rest = [i for i in one if i not in read]  # the same epoch's order, what was not read yet
    for k in range(0, len(rest), BATCH):
        step([rest[k : k + BATCH]])
    return {f"layers.{k}": v.detach().clone() for k, v in net.state_dict().items()}


def _node(out: Path, port: int, *, host: bool, name: str, doomed: bool = False) -> Job:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic",
        f"--rdzv-conf=is_host={int(host)},join_timeout=60,last_call_timeout=5",
        "--max-restarts=2", "--monitor-interval=0.5", str(SCRIPTS / "elastic_train.py"), str(out),
    ]  # fmt: skip
    env = job_env(
        PYTHONPATH=os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")]),
        ELASTIC_LOSE_THIS_NODE=str(int(doomed)),
    )
    for key in ("MASTER_ADDR", "MASTER_PORT"):  # the rendezvous decides them
        env.pop(key)
    return Job(command, out, env=env, name=name, warm=True)


def _wait_for(path: Path, jobs: list[Job], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        for job in jobs:
            assert job.poll() is None, f"{job.stderr_path.name} ended early\n{job.output()[-4000:]}"
        assert time.monotonic() < deadline, f"{path.name} never appeared\n" + "\n".join(
            j.output()[-3000:] for j in jobs
        )
        time.sleep(0.05)


@pytest.mark.timeout(150)
def test_a_lost_node_restarts_the_survivor_on_one_node_and_matches_plain_torch(tmp_path: Path) -> None:
    port = free_port()
    # Both nodes must join the first rendezvous round (a late node would force a membership change
    # before training). The node that is not the store's host starts first and waits, connecting,
    # for the host's store (join_timeout=60); the host joins as soon as it is up, and the other
    # follows at once. No pause between the two starts: the order is all that matters.
    lost = _node(tmp_path, port, host=False, name="node1", doomed=True)
    survivor: Job | None = None
    try:
        survivor = _node(tmp_path, port, host=True, name="node0")
        _wait_for(tmp_path / "ready", [survivor, lost], 90)
        assert (tmp_path / "ckpt" / f"epoch=0-step={CHECKPOINT_STEP}.ckpt").is_dir(), "no sharded checkpoint"
        killed_at = time.time()
        lost.kill_leftovers()  # the whole node: agent and worker
        lost.process.wait()
        code = survivor.wait(90)
        finished_at = time.time()
        assert lost.leftovers() == [] and survivor.leftovers() == [], "processes left behind"
    finally:
        for job in (lost, survivor):
            if job is not None:
                job.kill_leftovers()
                if job.poll() is None:
                    job.process.send_signal(signal.SIGKILL)
                    job.process.wait()
    assert survivor is not None
    assert code == 0, survivor.output()[-6000:]
    attempts = [line.split() for line in (tmp_path / "attempts.txt").read_text().splitlines()]
    # attempt 0 on 2 ranks from step 0; attempt 1 (restarted) on 1 rank from the step-3 checkpoint
    assert [a[:3] for a in attempts] == [["0", "2", "0"], ["1", "1", str(CHECKPOINT_STEP)]], attempts
    result = json.loads((tmp_path / "final.json").read_text())
    assert result["global_step"] == CHECKPOINT_STEP + 6  # 24 unread samples in batches of 4 on one rank
    expected = reference_weights()
    worst = max(
        (torch.tensor(values) - expected[name].flatten()).abs().max().item()
        for name, values in result["weights"].items()
    )
    assert set(result["weights"]) == set(expected)
    assert worst <= 1e-6, worst
    if FIGURES:
        restarted_at = float(attempts[1][3])
        figures = {
            "case": "elastic-fsdp-2to1",
            "launch_to_training_s": round(float(attempts[0][3]) - lost.started, 1),
            "kill_to_resumed_training_s": round(restarted_at - killed_at, 1),
            "kill_to_finished_s": round(finished_at - killed_at, 1),
            "max_abs_vs_torch": worst,
        }
        with open(FIGURES, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(figures) + "\n")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["model_parallel"])
def test_a_mid_epoch_checkpoint_from_two_ranks_resumes_on_one(tmp_path: Path, strategy: str) -> None:
    """Without torchrun: model_parallel's data-parallel DCP checkpoint, saved on 2 ranks, resumed on 1."""
    code, first = run_job(tmp_path, "elastic_resume.py", strategy, "2", str(tmp_path), timeout=150, name="two")
    assert code == 0, first.output()[-6000:]
    assert (tmp_path / "ckpt" / f"epoch=0-step={CHECKPOINT_STEP}.ckpt").exists(), first.output()[-3000:]
    code, second = run_job(tmp_path, "elastic_resume.py", strategy, "1", str(tmp_path), timeout=90, name="one")
    assert code == 0, second.output()[-6000:]
    assert "cannot be regrouped" not in second.stderr, second.stderr[-3000:]
    result = json.loads((tmp_path / "final.json").read_text())
    assert result["global_step"] == CHECKPOINT_STEP + 6
    expected = reference_weights()
    for name, values in result["weights"].items():
        difference = (torch.tensor(values) - expected[name].flatten()).abs().max().item()
        assert difference <= 1e-6, (name, difference)
