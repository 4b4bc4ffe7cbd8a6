"""Context-parallel and HSDP mesh options: layouts, the batch split and bad input, without processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from phalanx.errors import MisconfigurationError


def test_layout_dims_flattened_dims_and_coordinates() -> None:
    from phalanx_strategy_model_parallel._layout import resolve_layout

    plain = resolve_layout(2, 2, 1, num_nodes=1, num_processes=4)
    assert plain.dim_names == ("data_parallel", "tensor_parallel") and plain.flattened == ()
    assert plain.fsdp_dims == ("data_parallel",)

    cp = resolve_layout("auto", 1, 1, num_nodes=1, num_processes=4, context_parallel_size=2)
    assert (cp.shape, cp.dim_names) == ((2, 2, 1), ("data_parallel", "context_parallel", "tensor_parallel"))
    assert cp.fsdp_dims == ("data_parallel_context_parallel",)
    assert [cp.coordinates(r)["context_parallel"] for r in range(4)] == [0, 1, 0, 1]
    assert [cp.coordinates(r)["data_parallel"] for r in range(4)] == [0, 0, 1, 1]

    hsdp = resolve_layout(
        "auto", 2, 1, num_nodes=1, num_processes=16, context_parallel_size=2, data_parallel_replicate_size=2
    )
    assert hsdp.dim_names == ("data_parallel_replicate", "data_parallel_shard", "context_parallel", "tensor_parallel")
    assert hsdp.shape == (2, 2, 2, 2) and hsdp.data_parallel == 4 and hsdp.data_parallel_shard == 2
    assert dict(hsdp.flattened) == {
        "data_parallel": ("data_parallel_replicate", "data_parallel_shard"),
        "data_parallel_shard_context_parallel": ("data_parallel_shard", "context_parallel"),
        "data_parallel_context_parallel": ("data_parallel_replicate", "data_parallel_shard", "context_parallel"),
    }
    assert hsdp.fsdp_dims == ("data_parallel_replicate", "data_parallel_shard_context_parallel")
    last = hsdp.coordinates(15)
    assert (last["data_parallel_replicate"], last["data_parallel_shard"], last["data_parallel"]) == (1, 1, 3)

    both_auto = resolve_layout("auto", "auto", 1, num_nodes=2, num_processes=4, context_parallel_size=2)
    assert (both_auto.data_parallel, both_auto.context_parallel, both_auto.tensor_parallel) == (2, 2, 2)
    shard_given = resolve_layout(
        "auto",
        1,
        1,
        num_nodes=1,
        num_processes=8,
        data_parallel_replicate_size=2,
        data_parallel_shard_size=2,
        context_parallel_size=2,
    )
    assert shard_given.shape == (2, 2, 2, 1)


@pytest.mark.parametrize(
    ("sizes", "world", "fragments"),
    [
        (
            {"data_parallel_size": 2, "tensor_parallel_size": 2, "context_parallel_size": 2},
            4,
            [
                "2 x 2 x 2 x 1 = 8",
                "4 processes",
                "e.g. data_parallel_size=1, tensor_parallel_size=2, context_parallel_size=2",
            ],
        ),
        (
            {"data_parallel_size": "auto", "tensor_parallel_size": 1, "context_parallel_size": 3},
            4,
            ["'auto' size would be 4/3", "e.g. data_parallel_size=4, tensor_parallel_size=1, context_parallel_size=1"],
        ),
        (
            {"data_parallel_size": "auto", "tensor_parallel_size": 1, "data_parallel_replicate_size": 3},
            4,
            ["data_parallel_replicate_size=3 does not divide the data-parallel size 4", "data_parallel_shard_size=4"],
        ),
        (
            {
                "data_parallel_size": 4,
                "tensor_parallel_size": 1,
                "data_parallel_replicate_size": 2,
                "data_parallel_shard_size": 3,
            },
            4,
            ["must be data_parallel_replicate_size x data_parallel_shard_size = 6"],
        ),
        (
            {
                "data_parallel_size": "auto",
                "tensor_parallel_size": 1,
                "data_parallel_replicate_size": 2,
                "data_parallel_shard_size": 4,
            },
            4,
            ["2 replicate x 4 shard", "= 8, but the job has 4 processes"],
        ),
    ],
)
def test_sizes_that_do_not_fit_the_world_name_product_world_and_a_valid_choice(
    sizes: dict, world: int, fragments: list[str]
) -> None:
    from phalanx_strategy_model_parallel._layout import resolve_layout

    sizes = dict(sizes)
    args = (sizes.pop("data_parallel_size"), sizes.pop("tensor_parallel_size"), 1)
    with pytest.raises(MisconfigurationError, match="Fix:") as info:
        resolve_layout(*args, num_nodes=1, num_processes=world, **sizes)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_a_mesh_that_does_not_fit_fails_in_the_trainer_before_launch(tmp_path: Path) -> None:
    import phalanx
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    strategy = ModelParallelStrategy(
        data_parallel_replicate_size=2, data_parallel_shard_size=2, context_parallel_size=2, tensor_parallel_size=1
    )
    with pytest.raises(MisconfigurationError, match="= 8, but the job has 4 processes"):
        trainer = phalanx.Trainer(
            accelerator="cpu", devices=4, strategy=strategy, logger=False, default_root_dir=tmp_path
        )
        trainer.fit(phalanx.Module())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"context_parallel_size": 0}, "context_parallel_size=0) is invalid"),
        ({"data_parallel_replicate_size": "auto"}, "data_parallel_replicate_size='auto') is invalid"),
        ({"context_parallel_size": 2, "pipeline_parallel_size": 2}, "context parallel inside pipeline stages"),
        ({"context_parallel_seq_dims": -1}, "context_parallel_seq_dims=-1) is invalid"),
        ({"context_parallel_seq_dims": {"input_ids": "1"}}, "{'input_ids': 1, 'labels': 1}"),
    ],
)
def test_bad_context_parallel_arguments(kwargs: dict, fragment: str) -> None:
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    with pytest.raises(MisconfigurationError) as info:
        ModelParallelStrategy(**kwargs)
    assert fragment in str(info.value)


def test_load_balanced_split_gives_rank_i_chunks_i_and_2cp_minus_1_minus_i() -> None:
    from phalanx_strategy_model_parallel._context_parallel import load_balanced_positions, split_batch

    tokens = torch.arange(16).repeat(3, 1)  # batch 3, sequence 16
    labels = torch.tensor([1, 2, 3])  # 1-D: no sequence dim, never split
    parts = [split_batch((tokens, labels), 1, 4, rank) for rank in range(4)]
    assert parts[0][0][0].tolist() == [0, 1, 14, 15]
    assert parts[1][0][0].tolist() == [2, 3, 12, 13]
    assert all(p[1] is labels for p in parts)
    for rank, part in enumerate(parts):
        assert part[0][0].tolist() == load_balanced_positions(16, 4, rank).tolist()
    assert sorted(torch.cat([p[0][0] for p in parts]).tolist()) == list(range(16))

    batch = {"input_ids": tokens, "labels": tokens, "mask": tokens}
    split = split_batch(batch, {"input_ids": 1, "labels": 1, "mask": None}, 2, 1)
    assert split["input_ids"].shape == (3, 8) and split["mask"] is tokens


def test_a_sequence_length_the_split_cannot_divide_names_length_valid_lengths_and_fix() -> None:
    from phalanx_strategy_model_parallel._context_parallel import split_batch

    with pytest.raises(MisconfigurationError) as info:
        split_batch({"input_ids": torch.zeros(2, 10)}, {"input_ids": 1}, 2, 0)
    message = str(info.value)
    for fragment in ["batch['input_ids'] has length 10", "multiple of 4", "8 or 12", "pad the sequences", "Fix:"]:
        assert fragment in message, message
    with pytest.raises(MisconfigurationError, match="names batch keys, but the batch is a tuple"):
        split_batch((torch.zeros(2, 8),), {"input_ids": 1}, 2, 0)


def test_positions_outside_a_context_parallel_step_are_arange() -> None:
    from phalanx_strategy_model_parallel import context_parallel_positions

    assert context_parallel_positions(6).tolist() == list(range(6))
