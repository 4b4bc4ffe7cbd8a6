"""ZeRO stage 0, stage 1/2 with optimizer offload, bf16-true, gather_on_teardown=False and a fit
from a single-file checkpoint, all in one 2-rank job (scripts/ds_run.py ``variants``: several fits
in the same processes, one engine and process group each).

Numbers are compared with plain PyTorch computed here (test_checkpoint._plain_two_rank: the same
two shards, gradients averaged as DDP does, Adam and the script's scheduler).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ds_helpers import pytest_timeout_for, run_script
from test_checkpoint import _plain_two_rank

pytestmark = pytest.mark.timeout(pytest_timeout_for(runs=1))

TOLERANCE = 1e-5
RUNS = [
    {"tag": "stage0", "strategy": {"stage": 0}},
    {"tag": "offload1", "strategy": "deepspeed_stage_1_offload"},
    {"tag": "offload2", "strategy": "deepspeed_stage_2_offload", "convert": True},
    {"tag": "bf16true", "strategy": "deepspeed_stage_2", "precision": "bf16-true"},
    {"tag": "nogather", "strategy": {"stage": 3, "gather_on_teardown": False}, "reuse": True},
    {"tag": "evalfile", "strategy": {"stage": 3, "load_full_weights": True}, "ckpt": "offload2.ckpt", "validate": True},
    {"tag": "fromfile", "strategy": {"stage": 3, "load_full_weights": True}, "ckpt": "single.ckpt", "steps": 8},
]


def _single_device_checkpoint(out: Path) -> dict[str, torch.Tensor]:
    """A full single-file checkpoint (weights, optimizer, loop position) from 4 single-device steps."""
    from ds_run import Net, loader

    from phalanx import Trainer

    model = Net(32)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        default_root_dir=str(out),
    )
    trainer.fit(model, loader())
    trainer.save_checkpoint(out / "single.ckpt")
    (out / "single.ckpt.done").touch()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("variants")
    _single_device_checkpoint(out)
    ranks = run_script(out, "variants", "--steps", "4", "--runs", json.dumps(RUNS))
    assert sorted(ranks) == [0, 1]
    return out, ranks


def _close(actual: list[float], expected: list[float], tolerance: float, what: str) -> None:
    assert len(actual) == len(expected), (what, actual, expected)
    worst = max(abs(a - b) for a, b in zip(actual, expected))
    assert worst <= tolerance, f"{what}: {actual} vs plain torch {expected}"


ENGINE = {
    "stage0": {"stage": 0, "cpu_offload": False, "bf16": False},
    "offload1": {"stage": 1, "cpu_offload": True, "bf16": False},
    "offload2": {"stage": 2, "cpu_offload": True, "bf16": False},
}


@pytest.mark.parametrize("tag", ["stage0", "offload1", "offload2"])
def test_losses_and_weights_match_plain_torch(variants: tuple[Path, dict[int, dict[str, Any]]], tag: str) -> None:
    out, ranks = variants
    losses, weights = _plain_two_rank(4)
    for rank, results in ranks.items():
        assert results[tag]["engine"] == ENGINE[tag], "the engine did not run with the requested ZeRO settings"
        _close(results[tag]["losses"], losses[rank], TOLERANCE, f"{tag} rank {rank}")
        assert results[tag]["dtype"] == "torch.float32"
    got = torch.load(out / f"{tag}.weights.pt", weights_only=True)
    assert sorted(got) == sorted(weights)
    for key, value in weights.items():
        torch.testing.assert_close(got[key], value, atol=TOLERANCE, rtol=0, msg=lambda m, k=key: f"{tag} {k}: {m}")


def test_bf16_true_trains_in_bfloat16_close_to_float32(variants: tuple[Path, dict[int, dict[str, Any]]]) -> None:
    out, ranks = variants
    losses, _ = _plain_two_rank(4)
    for rank, results in ranks.items():
        run = results["bf16true"]
        assert run["dtype"] == "torch.bfloat16" and run["engine"]["bf16"] is True
        _close(run["losses"], losses[rank], 0.05 * max(map(abs, losses[rank])), f"bf16-true rank {rank}")
        assert run["losses"] != losses[rank]  # visibly not float32
    weights = torch.load(out / "bf16true.weights.pt", weights_only=True)
    assert all(value.dtype == torch.bfloat16 for value in weights.values())


def test_without_gather_on_teardown_the_module_stays_partitioned(variants: tuple[Path, dict[int, dict[str, Any]]]) -> None:
    _, ranks = variants
    losses, _ = _plain_two_rank(4)
    for rank, results in ranks.items():
        run = results["nogather"]
        _close(run["losses"], losses[rank], 1e-4, f"stage 3 rank {rank}")  # ZeRO-3's float32 bound (test_parity)
        assert run["partitioned"] == 4, "the weights were gathered back although gather_on_teardown=False"
        assert run["reuse"].startswith("MisconfigurationError") and "gather_on_teardown=True" in run["reuse"]
        # With the default gather, stage 3 hands back plain parameters holding every element.
        assert results["fromfile"]["partitioned"] == 0 and results["fromfile"]["data_numel"] == 321


def test_evaluation_from_a_converted_single_file(variants: tuple[Path, dict[int, dict[str, Any]]]) -> None:
    """Stage 3 validates from the file the stage-2-offload run was converted to: plain torch's weights."""
    _, ranks = variants
    _, weights = _plain_two_rank(4)
    from ds_run import build_layers, dataset

    model = build_layers(32)
    model.load_state_dict({k.removeprefix("layers."): v for k, v in weights.items()})
    x, y = dataset().tensors
    with torch.no_grad():
        expected = float(torch.nn.functional.mse_loss(model(x), y))
    for results in ranks.values():
        assert abs(results["evalfile"]["val_loss"] - expected) < 1e-4, (results["evalfile"], expected)


def test_fit_from_a_single_file_checkpoint_loads_its_weights_and_position(variants: tuple[Path, dict[int, dict[str, Any]]]) -> None:
    """Stage 3 fit from a single-device file: its weights and loop position come back (the optimizer restarts)."""
    out, ranks = variants
    from ds_run import BATCH, build_layers, dataset
    from torch.utils.data import DataLoader, DistributedSampler

    state = torch.load(out / "single.ckpt", weights_only=True)
    assert state["global_step"] == 4
    model = build_layers(32)
    model.load_state_dict({k.removeprefix("layers."): v for k, v in state["state_dict"].items()})
    for rank, results in ranks.items():
        run = results["fromfile"]
        assert run["global_step"] == 8 and len(run["losses"]) == 4, run
        shard = DataLoader(dataset(), batch_size=BATCH, sampler=DistributedSampler(dataset(), num_replicas=2, rank=rank, shuffle=False))
        x, y = list(shard)[4]  # the loop resumes at step 4 of the epoch
        with torch.no_grad():
            expected = float(torch.nn.functional.mse_loss(model(x), y))
        # The first step's loss is computed before any update: the loaded weights on that batch.
        assert abs(run["losses"][0] - expected) <= 1e-5, (run["losses"], expected)
