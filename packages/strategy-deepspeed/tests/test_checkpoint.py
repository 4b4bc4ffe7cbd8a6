"""Checkpoints: exact resume, another model, another world size, evaluation of a sharded checkpoint.

One 2-rank run (ZeRO-3 with CPU offload of parameters and optimizer, layers built in
configure_model) trains 6 steps straight, then 3 steps saved by ModelCheckpoint, resumed with
``ckpt_path="last"`` to 6 in a new Trainer: the resumed losses must equal the straight run's bit
for bit. A 1-process run then tries that
checkpoint with another model and with another world size (both refused, with a message naming
the fix), validates from it (consolidated on the fly) and trains a few steps in bf16 on CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ds_helpers import pytest_timeout_for, run_script

# At most two chained runs per test (the module's resume run, then each test's own run).
pytestmark = pytest.mark.timeout(pytest_timeout_for(runs=2))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[int, dict[str, Any]]]]:
    out = tmp_path_factory.mktemp("resume")
    ranks = run_script(out, "resume", "--strategy", "deepspeed_stage_3_offload", "--lazy", "--steps", "6")
    yield out, ranks


#: ZeRO-3 partitions and re-gathers float32 parameters: the same bound as test_parity.py's stage 3.
TOLERANCE = 1e-4


def _plain_two_rank(steps: int) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    """Plain torch in this process: 2 ranks' shards (DistributedSampler, no shuffle), gradients
    averaged as DDP does, Adam + the script's scheduler. Returns per-rank losses and final weights."""
    from ds_run import BATCH, LR, build_layers, dataset, scheduler
    from torch.utils.data import DataLoader, DistributedSampler

    model = build_layers(32)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=LR)
    schedule = scheduler(optimizer)
    shards = [
        DataLoader(dataset(), batch_size=BATCH, sampler=DistributedSampler(dataset(), num_replicas=2, rank=r, shuffle=False))
        for r in (0, 1)
    ]
    losses: list[list[float]] = [[], []]
    for _, batches in zip(range(steps), zip(*shards)):
        grads = []
        for rank, (x, y) in enumerate(batches):
            loss = F.mse_loss(model(x), y)
            losses[rank].append(loss.item())
            grads.append(torch.autograd.grad(loss, params))
        for param, g0, g1 in zip(params, *grads):
            param.grad = g0 / 2 + g1 / 2
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    return losses, {f"layers.{k}": v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_is_exact(resumed: tuple[Path, dict[int, dict[str, Any]]]) -> None:
    out, ranks = resumed
    assert sorted(ranks) == [0, 1]
    plain, _ = _plain_two_rank(6)
    for rank, result in ranks.items():
        assert len(result["straight"]) == 6
        worst = max(abs(a - b) for a, b in zip(result["straight"], plain[rank]))
        assert worst <= TOLERANCE, f"rank {rank}: ZeRO-3 offload {result['straight']} vs plain {plain[rank]}"
        assert result["first"] == result["straight"][:3]
        assert result["resumed"] == result["straight"][3:], "resumed losses differ from the uninterrupted run"
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert saved == ["epoch=0-step=3.ckpt", "last.ckpt"], saved
    layout = sorted(p.name for p in (out / "checkpoints" / "last.ckpt").iterdir())
    assert {"latest", "phalanx_deepspeed.json", "trainer_state.pt", "checkpoint"} <= set(layout)
    shards = sorted(p.name for p in (out / "checkpoints" / "last.ckpt" / "checkpoint").glob("*optim_states.pt"))
    assert len(shards) == 2, shards
    state = torch.load(out / "checkpoints" / "last.ckpt" / "trainer_state.pt", weights_only=True)
    assert state["global_step"] == 3 and "state_dict" not in state and "optimizer_states" not in state


def _reference_losses(steps: int) -> list[float]:
    """Plain torch on one process: the first ``steps`` batches, Adam, fp32."""
    from ds_run import BATCH, LR, build_layers, dataset, scheduler

    model = build_layers(32)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    schedule = scheduler(optimizer)
    data = dataset()
    losses = []
    for step in range(steps):
        x, y = data[step * BATCH : (step + 1) * BATCH]
        loss = F.mse_loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    return losses


def test_wrong_model_wrong_world_evaluation_and_bf16(resumed: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path) -> None:
    out, _ = resumed
    ckpt = str(out / "checkpoints" / "last.ckpt")
    common = ["--strategy", "deepspeed_stage_3", "--lazy", "--devices", "1", "--ckpt", ckpt]

    same = run_script(tmp_path / "reload", "reload", *common, "--other-hidden", "16", "--validate", "--bf16-steps", "4")[0]
    assert same["other"].startswith("CheckpointError: DeepSpeed checkpoint")
    assert "belongs to another model" in same["other"] and "checkpoint (32, 8) vs model (16, 8)" in same["other"]
    assert same["fit"].startswith("CheckpointError:")
    assert "saved by 2 rank(s)" in same["fit"] and "phalanx checkpoint convert" in same["fit"]

    # Evaluation at another world size works: the shards are consolidated into full weights, which
    # are those of plain torch after the checkpoint's 3 steps (so a wrong consolidation fails here).
    _, expected_weights = _plain_two_rank(3)
    weights = torch.load(tmp_path / "reload" / "converted.ckpt", weights_only=True)["state_dict"]
    assert sorted(weights) == sorted(expected_weights)
    for key, value in expected_weights.items():
        torch.testing.assert_close(weights[key], value, atol=TOLERANCE, rtol=0, msg=lambda m, k=key: f"{k}: {m}")
    from ds_run import build_layers, dataset

    model = build_layers(32)
    model.load_state_dict({k.removeprefix("layers."): v for k, v in expected_weights.items()})
    x, y = dataset().tensors
    with torch.no_grad():
        expected = F.mse_loss(model(x), y)  # 16 equal batches: the mean of batch means is the overall mean
    assert abs(same["val_loss"] - float(expected)) < TOLERANCE

    # bf16-mixed on CPU trains: close to fp32, but visibly not fp32.
    reference = _reference_losses(4)
    bf16 = same["bf16_losses"]
    assert len(bf16) == 4
    assert max(abs(a - b) / max(abs(b), 1e-3) for a, b in zip(bf16, reference)) < 0.05, (bf16, reference)
    assert bf16 != reference
