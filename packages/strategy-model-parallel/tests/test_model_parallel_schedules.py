"""Pipeline schedules, in one process: names, stage layouts, the block grouping and the microbatch
rules, each refusal with the value, the choices and the fix. The schedules' training runs are in
test_model_parallel_training.py."""

from __future__ import annotations

import pytest
import torch.distributed.pipelining as pipelining
from torch import nn
from torch.distributed.pipelining._utils import generate_rank_to_stage_mapping

from phalanx.errors import MisconfigurationError
from phalanx_strategy_model_parallel import ModelParallelStrategy
from phalanx_strategy_model_parallel._pipeline import (
    SCHEDULES,
    check_microbatches,
    last_stage_rank,
    stage_indices,
    stages_per_rank,
)
from phalanx_strategy_model_parallel._stages import group_blocks


def test_every_schedule_torch_ships_has_a_name() -> None:
    shipped = {getattr(pipelining, name) for name in pipelining.__all__ if name.startswith("Schedule")}
    assert shipped == {spec.torch_class for spec in SCHEDULES.values()}
    assert list(SCHEDULES) == [
        "gpipe",
        "1f1b",
        "interleaved_1f1b",
        "looped_bfs",
        "interleaved_zero_bubble",
        "zbv_zero_bubble",
        "dualpipe_v",
    ]


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("zbv", "zbv_zero_bubble"),
        ("ScheduleDualPipeV", "dualpipe_v"),
        ("Interleaved1F1B", "interleaved_1f1b"),
        ("looped-bfs", "looped_bfs"),
        ("zero_bubble", "zbv_zero_bubble"),
        ("bfs", "looped_bfs"),
    ],
)
def test_an_unknown_schedule_names_the_closest_and_every_choice(name: str, closest: str) -> None:
    with pytest.raises(MisconfigurationError) as info:
        ModelParallelStrategy(pipeline_parallel_size=2, pipeline_schedule=name)
    message = str(info.value)
    assert f"(pipeline_schedule={name!r}) is unknown. Did you mean {closest!r}?" in message
    assert str(list(SCHEDULES)) in message and "Fix:" in message


def test_split_backward_schedules_refuse_compiled_blocks() -> None:
    with pytest.raises(MisconfigurationError) as info:
        ModelParallelStrategy(pipeline_parallel_size=2, pipeline_schedule="dualpipe_v", compile_policy={nn.Linear})
    message = str(info.value)
    assert "pipeline_schedule='dualpipe_v', compile_policy=..." in message
    assert "['gpipe', '1f1b', 'interleaved_1f1b', 'looped_bfs']" in message and "Fix:" in message
    ModelParallelStrategy(pipeline_parallel_size=2, pipeline_schedule="looped_bfs", compile_policy={nn.Linear})


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("pp", [2, 4])
def test_stage_layouts_are_torchs(schedule: str, pp: int) -> None:
    """Every stage on exactly one rank, where torch's schedule expects it (loop or V mapping)."""
    per_rank = stages_per_rank(schedule, 3 * pp, pp)
    layout = SCHEDULES[schedule].layout
    assert per_rank == {"single": 1, "loop": 3, "v": 2}[layout]
    placed = {rank: stage_indices(schedule, rank, pp, per_rank) for rank in range(pp)}
    assert sorted(i for indices in placed.values() for i in indices) == list(range(pp * per_rank))
    torch_style = "v" if layout == "v" else "loop"
    assert placed == {r: list(s) for r, s in generate_rank_to_stage_mapping(pp, pp * per_rank, torch_style).items()}
    last = pp * per_rank - 1
    assert last in placed[last_stage_rank(schedule, pp)]


def test_blocks_are_grouped_into_consecutive_stages_earlier_ones_larger() -> None:
    blocks = [nn.Linear(2, 2) for _ in range(5)]
    stages = group_blocks(blocks, 4, name="M", schedule="looped_bfs", pipeline_size=2, layout="loop")
    assert isinstance(stages[0], nn.Sequential) and list(stages[0]) == blocks[:2]
    assert stages[1:] == blocks[2:]  # one block: the block itself
    two = group_blocks(blocks, 2, name="M", schedule="1f1b", pipeline_size=2, layout="single")
    assert [list(s) for s in two] == [blocks[:3], blocks[3:]]
    assert stages_per_rank("interleaved_1f1b", 7, 2) == 3  # as many as the blocks allow
    assert stages_per_rank("interleaved_1f1b", 3, 2) == 2  # at least two (then refused: 3 < 4 blocks)


@pytest.mark.parametrize(
    ("schedule", "layout", "fragment"),
    [
        ("zbv_zero_bubble", "v", "runs 4 stages (2 stages per rank (rank r runs stages r and 3 - r))"),
        ("interleaved_1f1b", "loop", "runs 4 stages (2 stages per rank (rank r runs stages r, r + 2, ...))"),
    ],
)
def test_too_few_blocks_are_refused_with_the_count_and_the_fix(schedule: str, layout: str, fragment: str) -> None:
    blocks = [nn.Linear(2, 2) for _ in range(3)]
    with pytest.raises(MisconfigurationError) as info:
        group_blocks(blocks, 4, name="Model", schedule=schedule, pipeline_size=2, layout=layout)
    message = str(info.value)
    assert f"Model.pipeline_stages() returned 3 block(s), but pipeline_schedule={schedule!r}" in message
    assert fragment in message and "Fix: return at least 4 blocks" in message


@pytest.mark.parametrize(
    ("schedule", "pp", "stages", "accepted", "refused", "fix"),
    [
        ("gpipe", 4, 4, [1, 3, 5], [], ""),
        ("looped_bfs", 2, 4, [1, 3, 5], [], ""),
        ("zbv_zero_bubble", 2, 4, [1, 3, 5], [], ""),
        ("1f1b", 4, 4, [4, 5, 9], [3], "one of [4]"),
        ("dualpipe_v", 2, 4, [4, 5], [3], "one of [4]"),
        ("interleaved_1f1b", 3, 6, [1, 2, 3, 4, 5, 6, 8, 9], [7], "one of [6, 8]"),
        ("interleaved_zero_bubble", 2, 4, [3, 4, 6, 8], [5], "one of [4, 6]"),
    ],
)
def test_microbatch_counts_each_schedule_runs(
    schedule: str, pp: int, stages: int, accepted: list[int], refused: list[int], fix: str
) -> None:
    """The counts torch's schedule classes accept (their constructors' checks), refused before any step."""
    for count in accepted:
        check_microbatches(schedule, count, pipeline_size=pp, num_stages=stages)
    for count in refused:
        with pytest.raises(MisconfigurationError) as info:
            check_microbatches(schedule, count, pipeline_size=pp, num_stages=stages)
        message = str(info.value)
        assert f"num_microbatches={count} does not run with pipeline_schedule={schedule!r}" in message
        assert f"Fix: set num_microbatches to {fix}" in message
