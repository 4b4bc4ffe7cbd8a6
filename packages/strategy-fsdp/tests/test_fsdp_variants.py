"""16-mixed, clipping by value, torch's ModuleWrapPolicy, and the resume paths that must refuse
(a directory without meta.pt, other optimizers) or load (a full file written by another strategy).

All of them are fits of one 2-rank job (scripts/variants.py). Losses are compared with the plain
torch DDP reference of the conftest, or with plain PyTorch emulated here: the same two ranks'
batches, gradients of ``loss / 2`` summed over the accumulation window and averaged over the
ranks (what DDP's all-reduce computes), clipped, AdamW.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_testing import pytest_timeout_for, read_ranks, run_phalanx

# The chain: the DDP reference and the first fsdp run (shared fixtures), then this module's job.
pytestmark = pytest.mark.timeout(pytest_timeout_for(runs=3))

ATOL = 1e-5
RUNS = [
    {"tag": "fp16", "precision": "16-mixed", "strategy": {"auto_wrap_policy": "Block"}},
    {"tag": "clipvalue", "clip": [0.01, "value"], "strategy": {"auto_wrap_policy": "Block"}, "epochs": 1},
    {"tag": "wrappolicy", "strategy": {"auto_wrap_policy": "ModuleWrapPolicy"}, "epochs": 1},
    {"tag": "direct", "clip": [None, "norm"], "accumulate": 1, "strategy": {"auto_wrap_policy": "Block"}, "epochs": 1},
    {"tag": "nometa", "resume": "nometa", "expect_error": True},
    {"tag": "twoopt", "model": "TwoOptimizers", "clip": [None, "norm"], "resume": "run1_epoch0", "expect_error": True},
    {"tag": "sgd", "model": "SGDMomentum", "resume": "run1_epoch0", "expect_error": True},
    {"tag": "fromfull", "resume": "single_full.ckpt", "strategy": {"auto_wrap_policy": "Block"}},
]


def _single_device_full_file(out: Path) -> None:
    """One epoch on one device with the Trainer settings of the fsdp runs: an ordinary full checkpoint."""
    from common import Net

    from phalanx import Trainer

    trainer = Trainer(
        accelerator="cpu", devices=1, max_epochs=1, accumulate_grad_batches=2, gradient_clip_val=0.5,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, default_root_dir=str(out),
    )
    trainer.fit(Net())
    trainer.save_checkpoint(out / "single_full.ckpt")


@pytest.fixture(scope="module")
def variants(fsdp_run: Path) -> tuple[Path, list[dict[str, Any]]]:
    out = fsdp_run
    shutil.copytree(out / "run1_epoch0", out / "nometa", ignore=shutil.ignore_patterns("meta.pt"))
    _single_device_full_file(out)
    run_phalanx("variants.py", str(out), json.dumps(RUNS))
    return out, read_ranks(out, "variants")


def _reference(out: Path) -> list[list[float]]:
    return [json.loads((out / f"ref_losses_rank{r}.json").read_text()) for r in range(2)]


def plain_two_rank(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    clip: tuple[float | None, str],
    epochs: int = 1,
    accumulate: int | None = None,
) -> list[list[float]]:
    """Plain PyTorch: 2 ranks' shards, accumulate 2 (or ``accumulate``), gradients averaged over ranks,
    clipped unless the clip value is None; per-rank losses."""
    from common import ACCUMULATE, BATCH_SIZE, dataset

    window = accumulate or ACCUMULATE
    from torch.utils.data import DataLoader, DistributedSampler

    data = dataset()
    shards = [DataLoader(data, batch_size=BATCH_SIZE, sampler=DistributedSampler(data, 2, r, shuffle=False)) for r in (0, 1)]
    params = list(model.parameters())
    losses: list[list[float]] = [[], []]
    sums = [[torch.zeros_like(p) for p in params] for _ in (0, 1)]
    for _ in range(epochs):
        for index, batches in enumerate(zip(*shards)):
            for rank, (x, y) in enumerate(batches):
                loss = torch.nn.functional.mse_loss(model(x), y)
                losses[rank].append(float(loss.detach()))
                sums[rank] = [s + g for s, g in zip(sums[rank], torch.autograd.grad(loss / window, params))]
            if (index + 1) % window:
                continue
            for p, g0, g1 in zip(params, *sums):
                p.grad = (g0 + g1) / 2
            value, algorithm = clip
            if value is None:
                pass
            elif algorithm == "norm":
                torch.nn.utils.clip_grad_norm_(params, value)
            else:
                torch.nn.utils.clip_grad_value_(params, value)
            optimizer.step()
            optimizer.zero_grad()
            sums = [[torch.zeros_like(p) for p in params] for _ in (0, 1)]
    return losses


def _close(actual: list[float], expected: list[float], atol: float, what: str) -> None:
    assert len(actual) == len(expected), (what, len(actual), len(expected))
    worst = max(abs(a - b) for a, b in zip(actual, expected))
    assert worst <= atol, f"{what}: largest per-step loss difference {worst:.3g} > {atol:g}"


SHARDED = ["", "net.0", "net.1"]  # the root and each Block


def test_16_mixed_computes_in_float16_close_to_float32(variants: tuple[Path, list[dict[str, Any]]]) -> None:
    out, ranks = variants
    for rank, (results, reference) in enumerate(zip(ranks, _reference(out))):
        run = results["fp16"]
        assert run["compute_dtype"] == "torch.float16"
        _close(run["losses"], reference, 0.02 * max(reference), f"16-mixed rank {rank}")
        assert run["losses"] != reference  # visibly not float32
        assert run["sharded"] == SHARDED


def test_clip_by_value_matches_plain_torch(variants: tuple[Path, list[dict[str, Any]]]) -> None:
    from common import make_net, make_optimizer

    out, ranks = variants
    model = make_net()
    expected = plain_two_rank(model, make_optimizer(model.parameters()), (0.01, "value"))
    for rank, results in enumerate(ranks):
        _close(results["clipvalue"]["losses"], expected[rank], ATOL, f"clip by value rank {rank}")
        # and it is not the norm clipping of the reference run
        assert max(abs(a - b) for a, b in zip(results["clipvalue"]["losses"], _reference(out)[rank])) > 1e-4


def test_the_direct_step_runs_through_fsdp_and_matches_plain_torch(variants: tuple[Path, list[dict[str, Any]]]) -> None:
    """No accumulation, no clipping: the loop's direct step, through the FSDP2 module's own hooks."""
    from common import make_net, make_optimizer

    model = make_net()
    expected = plain_two_rank(model, make_optimizer(model.parameters()), (None, "norm"), accumulate=1)
    for rank, results in enumerate(variants[1]):
        assert results["direct"]["direct_step"]
        assert results["clipvalue"]["direct_step"] is False  # clipping keeps the layered step
        _close(results["direct"]["losses"], expected[rank], ATOL, f"direct step rank {rank}")


def test_module_wrap_policy_shards_the_same_blocks_as_the_class_set(variants: tuple[Path, list[dict[str, Any]]]) -> None:
    out, ranks = variants
    for rank, (results, reference) in enumerate(zip(ranks, _reference(out))):
        assert results["wrappolicy"]["sharded"] == results["clipvalue"]["sharded"] == SHARDED
        _close(results["wrappolicy"]["losses"], reference[:12 // 2], ATOL, f"ModuleWrapPolicy rank {rank}")


def test_a_sharded_directory_without_meta_pt_is_refused(variants: tuple[Path, list[dict[str, Any]]]) -> None:
    for results in variants[1]:
        error = results["nometa"]["error"]
        assert error is not None and error.startswith("CheckpointError:")
        assert "holds DCP shards but no meta.pt" in error and "earlier checkpoint" in error


def test_another_number_of_optimizers_on_resume_is_refused(variants: tuple[Path, list[dict[str, Any]]]) -> None:
    for results in variants[1]:
        error = results["twoopt"]["error"]
        assert error is not None and error.startswith("CheckpointError:")
        assert "holds 1 optimizer state(s) but configure_optimizers created 2" in error


def test_another_optimizer_type_on_resume_is_refused_with_the_fix(variants: tuple[Path, list[dict[str, Any]]]) -> None:
    for results in variants[1]:
        error = results["sgd"]["error"]
        assert error is not None and "momentum_buffer" in error  # it is refused either way ...
        assert error.startswith("CheckpointError: Could not load the sharded checkpoint")  # ... but named so
        assert "same configure_optimizers" in error


def test_a_full_file_from_another_strategy_resumes_exactly(variants: tuple[Path, list[dict[str, Any]]]) -> None:
    """The ordinary single-file format (rank 0 of ddp and single_device write the same) resumed on 2 fsdp ranks."""
    from common import make_net, make_optimizer

    out, ranks = variants
    full = torch.load(out / "single_full.ckpt", weights_only=True)
    model = make_net()
    model.load_state_dict({k.removeprefix("net."): v for k, v in full["state_dict"].items()})
    optimizer = make_optimizer(model.parameters())
    optimizer.load_state_dict(full["optimizer_states"][0])
    expected = plain_two_rank(model, optimizer, (0.5, "norm"))  # epoch 1 of 2: the file ended epoch 0
    for rank, results in enumerate(ranks):
        run = results["fromfull"]
        assert run["global_step"] == full["global_step"] + 3
        _close(run["losses"], expected[rank], ATOL, f"resumed from a full file, rank {rank}")
