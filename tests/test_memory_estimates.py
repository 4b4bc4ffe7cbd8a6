"""Honest numbers: each family's estimate against what two real CPU ranks hold after a step.

One subprocess trains ``MeasuredNet`` at two widths (about 1.2 MB and 4.5 MB of float32 weights)
for two AdamW steps under ddp, fsdp, deepspeed_stage_2 and deepspeed_stage_3 on gloo (DeepSpeed
with ``DS_ACCELERATOR=cpu``); every rank counts the bytes of each live tensor storage
(``phalanx.testing.memory_probe``, the probe the conformance kit's memory check runs). The estimates are computed here, in the same test,
from the same factory built on the meta device. Held to 10 %:

- every family: parameter bytes and optimizer-state bytes (AdamW state plus the float32 master
  partitions DeepSpeed steps) at rest after the step;
- ddp, fsdp: gradient bytes at rest (``param.grad`` survives the step);
- ZeRO-2: gradients as the growth from after the step to after backward, summed over both ranks
  (its gradient partitions exist only from backward to the step, and DeepSpeed splits them at
  element boundaries, so one rank can hold a little less than the other);
- ZeRO-3: the whole at-rest total, whose reduce bucket (``reduce_bucket_size`` elements) dominates,
  and the total without that bucket.

Not measured by that walk: DDP's gradient buckets (C++, invisible to ``gc``) and ZeRO-2's
reduce buckets, which exist only inside backward.

The peak itself is measured, not sampled at hooks: the probe runs under torch's ``MemTracker``
(entered before the model is built, so it sees every tensor the run allocates and frees, inside
backward and the optimizer step too) and reads the second step's peak. Each estimate's ``total``
(steady parts + the larger of backward's working set and the optimizer step's temporaries) is
held to it within 10 %, per rank:

- ``MeasuredNet`` (weights dominate) under ddp, fsdp, ZeRO-2 and ZeRO-3 at both widths;
- ``BlockNet`` (4 MLP blocks over 64-token sequences, activations about as large as the weights)
  under ddp, fsdp, model_parallel (data parallel, each block ``fully_shard``-ed), ZeRO-2 and
  ZeRO-3, each with and without full activation checkpointing of the blocks. DeepSpeed runs with a
  1M-element reduce bucket there: at its 200M default the bucket is 99 % of the peak and would
  hide every other term.

fsdp's peak on ``MeasuredNet`` has two values, whatever the machine: 18.05 MB at width 1024 in most
rank-runs (the end of forward, where the estimate's ``total`` sits) and, in a few percent of them
on either rank, up to 20.27 MB in backward. The root unit is resharded after forward and gathered
again in backward. That all-gather's flat output buffer is usually freed by the main thread right
after its copy-out; when gloo's worker thread, which ran the collective, drops the last reference
instead, the buffer is freed only after backward has allocated the unit's unsharded gradients:
one gathered unit more than usual, at a moment the run does not control (seen in 1 of 56
rank-runs of fsdp alone; 3 of 34 after a ZeRO-3 run, as here: DeepSpeed replaces
``torch.nn.functional.linear`` for the rest of the process, which changes the timing, not the
sizes). The test holds fsdp's peak between the estimate without that buffer and with it
(:func:`fsdp_peak_with_late_all_gather`); every other family is held to its ``total``.

model_parallel with activation checkpointing once missed (0.887x, and 0.913x on every later run):
the recomputed block's gradients exist beside its recomputed saved tensors in its backward, one
block's saved bytes the estimate did not count; with them it is 1.000x (27.05 MB against 27.06 MB,
27.85 MB in that failing run). Without checkpointing the estimates still leave out backward's
net share of activation gradients (about 1.3 MB, 2.5-4 % of BlockNet's peaks).

ZeRO-3 with activation checkpointing once missed (0.86x): checkpointing moves ZeRO-3's peak from
backward to the optimizer step, where DeepSpeed flattens the float32 gradient partition into a
new tensor beside the partition it keeps, one partition more than the estimate's step had; with it
counted the estimate is 0.965x the measured peak.
"""

from __future__ import annotations

from typing import Any

import pytest

from phalanx.memory import MemoryEstimate
from phalanx.model_shapes import build_on_meta, summarize_model
from phalanx.testing.memory import measure, planned
from phalanx.testing.memory_probe import build

WIDTHS = (512, 1024)
STRATEGIES = ("ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3")
BLOCKS = "b256"
#: One probe process each, and one model_parallel fit per process: a second model_parallel fit in
#: the same processes peaks 4 MB higher (about one block's weights and gradients, unsharded; not yet
#: understood), which a user's one fit per process does not see.
BLOCK_RUNS = (
    ("model_parallel+dp", "fsdp+ac", "fsdp", "ddp"),
    ("model_parallel+dp+ac",),
    ("deepspeed_stage_2+bucket", "deepspeed_stage_2+bucket+ac", "deepspeed_stage_3+bucket", "deepspeed_stage_3+bucket+ac"),
)
TOLERANCE = 0.10
RUN_TIMEOUT = 300
pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 60)


def estimate_for(name: str, width: int | str) -> MemoryEstimate:
    found = planned(name, width=width, devices=2)
    assert found is not None, f"{name} gave no estimate"
    return found


def close(estimated: int, measured: int) -> bool:
    return abs(estimated - measured) <= TOLERANCE * measured


def fsdp_peak_with_late_all_gather(est: MemoryEstimate, width: int) -> int:
    """fsdp's peak in backward when the backward all-gather's buffer outlives its copy-out.

    Without an ``auto_wrap_policy`` the whole model is fsdp's one unit, resharded after forward
    and gathered again for backward into a flat buffer of the unit's float32 bytes. Usually that
    buffer is freed right after its copy-out, backward's peak stays below forward's, and the peak
    is ``est.total``. When gloo's worker thread frees it late, it coexists with the gathered
    parameters and the unsharded gradients, while the sharded gradients are gone (``zero_grad``
    runs before backward): ``total - gradients + one gathered unit``. Measured at width 1024:
    20.27 MB against 20.24 MB from this formula (18.05 MB on the usual path, against the
    estimate's 17.99 MB).
    """
    unit = summarize_model(build_on_meta(lambda: build(width))).numel * 4  # float32, the whole model
    return est.total - est.gradients + unit


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], list[dict[str, Any]]]:
    found = measure(tmp_path_factory.mktemp("memory"), list(STRATEGIES), list(WIDTHS), timeout=RUN_TIMEOUT)
    return {(name, width): found[f"{name}-{width}"] for name in STRATEGIES for width in WIDTHS}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", STRATEGIES)
def test_estimate_matches_measured(name: str, width: int, measured: dict[tuple[str, int], list[dict[str, Any]]]) -> None:
    est = estimate_for(name, width)
    for rank, got in enumerate(measured[name, width]):
        where = f"{name} width {width} rank {rank}: estimate {est} vs measured {got}"
        assert close(est.parameters, got["parameters"]), where
        if name == "deepspeed_stage_3":
            bucket = est.other  # the persistent reduce bucket
            assert close(est.total, got["total"]), where
            steady = est.parameters + est.gradients + est.optimizer_states
            assert close(steady, got["total"] - bucket), where
            continue
        assert close(est.optimizer_states, got["optimizer_states"]), where
        if name != "deepspeed_stage_2":
            assert close(est.gradients, got["gradients"]), where
    if name == "deepspeed_stage_2":  # partitions split at element boundaries: compare the world's sum
        growth = sum(got["peak"] - got["total"] for got in measured[name, width])
        assert close(2 * est.gradients, growth), f"{name} width {width}: 2 x {est.gradients} vs {growth}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", STRATEGIES)
def test_total_matches_the_tracked_peak(
    name: str, width: int, measured: dict[tuple[str, int], list[dict[str, Any]]]
) -> None:
    est = estimate_for(name, width)
    for rank, got in enumerate(measured[name, width]):
        peak = got["tracked_peak"]
        where = f"{name} width {width} rank {rank}: estimate {est} vs tracked peak {peak}"
        if name == "fsdp":  # two paths (module docstring): near either end, or between them
            late = fsdp_peak_with_late_all_gather(est, width)
            where += f"; with the backward all-gather's buffer freed late {late}"
            assert close(est.total, peak) or close(late, peak) or est.total <= peak <= late, where
        else:
            assert close(est.total, peak), where


@pytest.fixture(scope="module")
def measured_blocks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for run in BLOCK_RUNS:
        found.update(measure(tmp_path_factory.mktemp("blocks"), list(run), [BLOCKS], timeout=RUN_TIMEOUT))
    return found


@pytest.mark.parametrize("name", [spec for run in BLOCK_RUNS for spec in run])
def test_block_model_total_matches_the_tracked_peak(name: str, measured_blocks: dict[str, list[dict[str, Any]]]) -> None:
    est = estimate_for(name, BLOCKS)
    records = measured_blocks[f"{name}-{BLOCKS}"]
    assert len(records) == 2, records
    for rank, got in enumerate(records):
        where = f"{name} rank {rank}: estimate {est} vs tracked peak {got['tracked_peak']}"
        assert close(est.total, got["tracked_peak"]), where


#: ZeRO-2's tracked peak is not always in the forward: on some runs it is in the backward, while
#: the two reduce buckets are filled, where checkpointing saves nothing (measured once:
#: 49.25 MB checkpointed against 49.23 MB plain, both within 10 % of the checkpointed estimate).
#: There the check is that checkpointing costs nothing beyond the tracker's noise.
_PEAK_MAY_BE_IN_THE_BUCKETS = {"deepspeed_stage_2+bucket": 0.001}


def test_checkpointing_lowers_the_estimate_and_the_measured_peak(measured_blocks: dict[str, list[dict[str, Any]]]) -> None:
    """Where the estimate says full checkpointing saves memory, the measured peak is lower too
    (or, for ZeRO-2, no higher: see _PEAK_MAY_BE_IN_THE_BUCKETS)."""
    for name in ("fsdp", "model_parallel+dp", "deepspeed_stage_2+bucket", "deepspeed_stage_3+bucket"):
        plain, checkpointed = estimate_for(name, BLOCKS), estimate_for(f"{name}+ac", BLOCKS)
        assert checkpointed.total < plain.total, name
        for rank in range(2):
            before = measured_blocks[f"{name}-{BLOCKS}"][rank]["tracked_peak"]
            after = measured_blocks[f"{name}+ac-{BLOCKS}"][rank]["tracked_peak"]
            noise = _PEAK_MAY_BE_IN_THE_BUCKETS.get(name)
            if noise is None:
                assert after < before, f"{name} rank {rank}: {after} (checkpointed) >= {before}"
            else:
                assert after <= before * (1 + noise), f"{name} rank {rank}: {after} (checkpointed) > {before}"
