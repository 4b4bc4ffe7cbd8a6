"""Every mesh trains exactly like plain PyTorch built from the same DTensor / pipelining calls.

Per-step losses are compared with the plain-torch reference run on the same ranks after the
phalanx fit (same TP plan, fully_shard, PipelineStage and schedule, torch's DistributedSampler),
and the final (gathered) weights with one process training the whole model on the global batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mp_common import loader, loss_fn, make_net, single_process, single_process_weights
from mp_testing import DP_SCHEDULE_RUNS, SCHEDULE_RUNS, read_ranks

pytestmark = pytest.mark.timeout(300)

LOSS_ATOL, WEIGHT_ATOL = 1e-5, 1e-4


def _worst(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a, (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def _weights(out: Path, tag: str, world: int) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for rank in range(world):
        path = out / f"{tag}_weights_rank{rank}.pt"
        if path.exists():
            merged.update(torch.load(path, weights_only=True))
    return merged


def _assert_weights_match_single_process(weights: dict[str, torch.Tensor], epochs: int = 2) -> float:
    reference = single_process_weights(epochs)
    assert set(weights) == {f"net.{k}" for k in reference}
    worst = max(float((weights[f"net.{k}"] - v).abs().max()) for k, v in reference.items())
    assert worst <= WEIGHT_ATOL, f"final weights differ from one process by {worst:.3g}"
    return worst


@pytest.mark.parametrize(("fixture", "tag", "world"), [("mesh_2x2", "t22", 4), ("mesh_1x2", "t12", 2)])
def test_tensor_parallel_losses_and_weights(request: pytest.FixtureRequest, fixture: str, tag: str, world: int) -> None:
    out = request.getfixturevalue(fixture)
    results = read_ranks(out, tag, world)
    for result in results:
        assert result["global_step"] == 16
        assert _worst(result["losses"], result["reference_losses"]) <= LOSS_ATOL
        assert len(set(result["losses"])) > 1
    # tensor-parallel peers read the same batch; data-parallel ranks different ones
    by_coords = {(r["coords"]["data_parallel"], r["coords"]["tensor_parallel"]): r["losses"] for r in results}
    for (dp, tp), losses in by_coords.items():
        assert losses == by_coords[(dp, 0)]
        if dp:
            assert losses != by_coords[(0, tp)]
    _assert_weights_match_single_process(_weights(out, tag, world))


@pytest.mark.parametrize("tag", ["pp_gpipe", "pp_1f1b"])
def test_pipeline_schedules_match_plain_pipelining(pipeline_2: Path, tag: str) -> None:
    results = read_ranks(pipeline_2, tag, 2)
    for result in results:
        assert result["global_step"] == 16
        assert _worst(result["losses"], result["reference_losses"]) <= LOSS_ATOL
    assert results[0]["losses"] == results[1]["losses"]  # the loss is shared over the pipeline
    _assert_weights_match_single_process(_weights(pipeline_2, tag, 2))


def test_pipeline_validation_and_predict(pipeline_2: Path) -> None:
    """Validation under no_grad runs the schedule forward-only; predict returns the last stage's outputs."""
    results = read_ranks(pipeline_2, "pp_gpipe", 2)
    assert results[0]["val_losses"] and results[0]["val_losses"] == results[1]["val_losses"]
    net = make_net()
    net.load_state_dict({k.removeprefix("net."): v for k, v in _weights(pipeline_2, "pp_gpipe", 2).items()})
    x, _ = next(iter(loader(1)))
    expected = net(x).flatten().tolist()
    for result in results:
        assert max(abs(a - b) for a, b in zip(result["predictions"][0], expected)) <= 1e-5


@pytest.mark.parametrize(("tag", "schedule", "model", "accumulate", "checkpointed"), SCHEDULE_RUNS)
def test_pipeline_schedules_match_one_process(
    pipeline_schedules_2: Path, tag: str, schedule: str, model: str, accumulate: int, checkpointed: bool
) -> None:
    """Each schedule, its blocks grouped into its stages and placed by its layout, trains like one
    process on the whole batch: per-batch losses and final weights within 1e-5 (with gradient
    accumulation where ``accumulate`` is 2, activation checkpointing where ``checkpointed``)."""
    depth = int(model.removeprefix("Blocks")) - 1  # Blocks<n>: n - 1 residual blocks and the head
    losses, net = single_process(1, depth=depth, batches=4, accumulate=accumulate)
    results = read_ranks(pipeline_schedules_2, tag, 2)
    for result in results:
        assert result["global_step"] == 4 // accumulate
        assert _worst(result["losses"], losses) <= 1e-5
    assert results[0]["losses"] == results[1]["losses"]  # shared from the rank of the last stage
    weights = _weights(pipeline_schedules_2, tag, 2)
    reference = net.state_dict()
    assert set(weights) == {f"net.{k}" for k in reference}
    worst = max(float((weights[f"net.{k}"] - v).abs().max()) for k, v in reference.items())
    assert worst <= 1e-5, f"{schedule}: final weights differ from one process by {worst:.3g}"
    assert max(float((v - make_net(depth=depth).state_dict()[k]).abs().max()) for k, v in reference.items()) > 1e-3
    if checkpointed:  # the same run without checkpointing computed fewer block forwards: recomputation happened
        plain_tag = next(run[0] for run in SCHEDULE_RUNS if run[1] == schedule and not run[4])
        plain = read_ranks(pipeline_schedules_2, plain_tag, 2)
        assert all(r["mlp_forward_calls"] > p["mlp_forward_calls"] > 0 for r, p in zip(results, plain))


@pytest.mark.parametrize(("tag", "depth"), [("s_interleaved_1f1b", 3), ("s_zbv_zero_bubble", 3)])
def test_multi_stage_schedules_validate_and_predict(pipeline_schedules_2: Path, tag: str, depth: int) -> None:
    """Forward-only runs of the loop and V layouts (under ZB-V the last stage is on pipeline rank 0):
    validation losses and predictions reach both ranks, equal to the trained model's on one process."""
    _, net = single_process(1, depth=depth, batches=4)
    x, _ = next(iter(loader(1)))
    with torch.no_grad():
        val = [float(loss_fn(net(bx), by)) for bx, by in list(loader(1))[:2]]
        expected = net(x).flatten().tolist()
    results = read_ranks(pipeline_schedules_2, tag, 2)
    for result in results:
        assert _worst(result["val_losses"][-2:], val) <= 1e-5  # the validation after the last step
        assert max(abs(a - b) for a, b in zip(result["predictions"][0], expected)) <= 1e-5
    assert results[0]["val_losses"] == results[1]["val_losses"]


def test_data_parallel_times_pipeline_parallel(pipeline_dp2_pp2: Path) -> None:
    results = read_ranks(pipeline_dp2_pp2, "dp2pp2", 4)
    for result in results:
        assert _worst(result["losses"], result["reference_losses"]) <= LOSS_ATOL
    _assert_weights_match_single_process(_weights(pipeline_dp2_pp2, "dp2pp2", 4))


@pytest.mark.parametrize(("tag", "schedule", "accumulate"), DP_SCHEDULE_RUNS)
def test_data_parallel_times_multi_stage_schedules(
    pipeline_dp2_pp2: Path, tag: str, schedule: str, accumulate: int
) -> None:
    """The V and loop layouts with each stage sharded over data parallel (torch's schedule unshards,
    reshards and reduces the stage's gradients itself) train like one process on the global batch."""
    losses, net = single_process(1, depth=3, batches=4, accumulate=accumulate)
    results = read_ranks(pipeline_dp2_pp2, tag, 4)
    for result in results:
        assert result["global_step"] == 4 // accumulate
        assert _worst(result["global_losses"], losses) <= 1e-5
    weights = _weights(pipeline_dp2_pp2, tag, 4)
    worst = max(float((weights[f"net.{k}"] - v).abs().max()) for k, v in net.state_dict().items())
    assert worst <= 1e-5, f"{schedule}: final weights differ from one process by {worst:.3g}"


@pytest.mark.parametrize(("tag", "dtype"), [("bf16mixed", "torch.float32"), ("bf16true", "torch.bfloat16")])
def test_bf16_precisions_match_plain_torch_in_bf16(mesh_1x2: Path, tag: str, dtype: str) -> None:
    """bf16-mixed (fp32 weights, autocast) and bf16-true (bf16 weights) against the same DTensor calls
    in plain torch under the same precision; and, being bf16, not equal to the fp32 run."""
    fp32 = read_ranks(mesh_1x2, "t12", 2)[0]["losses"][:8]
    for result in read_ranks(mesh_1x2, tag, 2):
        assert result["param_dtype"] == dtype
        assert _worst(result["losses"], result["reference_losses"]) <= LOSS_ATOL
        assert _worst(result["losses"], fp32) > 0


def test_reference_runs_used_the_same_data(mesh_2x2: Path) -> None:
    """Sanity of the comparison itself: data-parallel ranks' mean is the global batch's loss."""
    results = read_ranks(mesh_2x2, "t22", 4)
    first = [r["losses"][0] for r in results if r["coords"]["tensor_parallel"] == 0]
    assert abs(sum(first) / 2 - results[0]["global_losses"][0]) < 1e-6
    assert json.loads((mesh_2x2 / "t22_rank0.json").read_text())["coords"]["data_parallel"] == 0
