"""Elastic resume of an epoch's data position: every remaining sample exactly once on a new replica count.

The reference is torch's own ``DistributedSampler``: what the old ranks consumed is read from real
samplers, the rest comes from :mod:`phalanx.trainer._resume`, and together they must cover the
dataset exactly once (padding aside).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from phalanx.strategies._distributed import inject_distributed_sampler
from phalanx.trainer._resume import (
    RemainderSampler,
    global_order,
    needs_regroup,
    record_position,
    regroup,
    regroup_resumed_epoch,
)


def _data(size: int) -> TensorDataset:
    return TensorDataset(torch.arange(size, dtype=torch.float32).unsqueeze(1))


def _shard(size: int, replicas: int, rank: int, *, shuffle: bool, drop_last: bool, epoch: int) -> list[int]:
    sampler = DistributedSampler(
        _data(size), num_replicas=replicas, rank=rank, shuffle=shuffle, seed=0, drop_last=drop_last
    )
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.parametrize(
    ("size", "shuffle", "drop_last"), [(48, True, False), (50, True, False), (50, False, True), (7, True, False)]
)
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_nothing_consumed_reproduces_distributed_sampler(
    size: int, shuffle: bool, drop_last: bool, replicas: int
) -> None:
    order = global_order(size, seed=0, shuffle=shuffle, epoch=3)
    for rank in range(replicas):
        ours = list(RemainderSampler(order, 0, num_replicas=replicas, rank=rank, drop_last=drop_last))
        assert ours == _shard(size, replicas, rank, shuffle=shuffle, drop_last=drop_last, epoch=3)


@pytest.mark.parametrize("size", [48, 50, 13])
@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (2, 3), (3, 2), (4, 2), (2, 2)])
def test_consumed_plus_rest_covers_the_epoch_once(size: int, old: int, new: int) -> None:
    batch = 4
    shards = [_shard(size, old, rank, shuffle=True, drop_last=False, epoch=1) for rank in range(old)]
    batches_per_rank = -(-len(shards[0]) // batch)
    for done in range(batches_per_rank + 1):
        consumed = [i for shard in shards for i in shard[: done * batch]]
        skip = min(done * batch, len(shards[0])) * old
        order = global_order(size, seed=0, shuffle=True, epoch=1)
        assert sorted(set(consumed)) == sorted(order[: min(skip, size)])  # the first positions, nothing else
        rest = [
            list(RemainderSampler(order, skip, num_replicas=new, rank=rank, drop_last=False)) for rank in range(new)
        ]
        lengths = {len(r) for r in rest}
        assert len(lengths) == 1, "every new rank must read as many samples (collectives stay in step)"
        rest_set = set(itertools.chain.from_iterable(rest))
        assert not rest_set & set(consumed), f"seen twice after {done} batches: {sorted(rest_set & set(consumed))}"
        assert rest_set | set(consumed) == set(range(size)), f"skipped after {done} batches"
        padding = sum(lengths) - len(rest_set)
        assert padding < new  # only the pad DistributedSampler itself would add


def test_regroup_translates_a_two_rank_position_to_one_rank_and_back() -> None:
    """The fit loop's path: a 2-rank loader records its position; a 1-rank plain loader resumes it."""
    size, batch, epoch = 50, 4, 2
    plain = DataLoader(_data(size), batch_size=batch, shuffle=True)
    two = [inject_distributed_sampler(plain, None, num_replicas=2, rank=rank) for rank in range(2)]
    for loader in two:
        loader.sampler.set_epoch(epoch)
    record = record_position(two[0], 3, None)
    assert record is not None and record["samples_done"] == 24 and record["replicas"] == 2
    assert needs_regroup(record, plain) and not needs_regroup(record, two[1])
    assert regroup_resumed_epoch(two[1], {"position": record, "phase": "train", "batches_done": 3}, epoch, 1) is None

    seen = [int(x) for loader in two for b in itertools.islice(loader, 3) for x in b[0].flatten()]
    moved = regroup(plain, record, epoch)
    assert moved is not None
    rest = [int(x) for b in moved.loader for x in b[0].flatten()]
    assert sorted(seen + rest) == list(range(size))
    assert moved.start + len(moved.loader) == len(plain)  # the rest ends where a 1-rank epoch ends

    # checkpointed again inside the regrouped epoch, then resumed on 2 ranks: still each sample once
    again = record_position(plain, moved.start + 2, moved)
    assert again is not None and again["regrouped"] and again["samples_done"] == 24 + 2 * batch
    later = [regroup(loader, again, epoch) for loader in two]
    tail = [int(x) for part in later if part is not None for b in part.loader for x in b[0].flatten()]
    assert sorted(seen + rest[: 2 * batch] + tail) == list(range(size))


def test_a_changed_dataset_is_not_regrouped() -> None:
    loader = DataLoader(_data(20), batch_size=4, shuffle=True)
    record = {"size": 21, "seed": 0, "shuffle": True, "drop_last": False, "samples_done": 8, "replicas": 2}
    assert regroup(loader, record, 0) is None
    with pytest.warns(UserWarning, match="cannot be regrouped"):
        assert regroup_resumed_epoch(loader, {"position": record, "phase": "train", "batches_done": 1}, 0, 1) is None
