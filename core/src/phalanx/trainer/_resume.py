"""Resuming an epoch on a different number of data-parallel replicas (elastic world size).

A mid-epoch checkpoint records how many samples of the epoch's *global* order the ranks consumed
together and how many replicas there were. ``DistributedSampler`` draws its global order from
``seed + epoch`` alone (the replica count only decides the padding and which rank gets which
position), and rank ``r`` of ``R`` reads positions ``r, r + R, ...``: after ``m`` samples per rank
the job has consumed exactly the first ``m * R`` positions of that order. So on a new replica count
the remaining positions can be split over the new ranks: no sample is seen twice or skipped.

What is reinterpreted, not reproduced: which rank reads which of the remaining samples and how
they are grouped into batches (the new ranks split the rest round-robin, like DistributedSampler);
the padding (when the rest does not divide by the new count, the first remaining samples are
repeated, or with ``drop_last=True`` the tail is dropped, as DistributedSampler does for a whole
epoch); and the batch index the loop reports for the rest of that epoch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, Sampler

__all__ = [
    "Regrouped",
    "RemainderSampler",
    "find_distributed_sampler",
    "global_order",
    "needs_regroup",
    "record_position",
    "regroup",
    "regroup_resumed_epoch",
]


def find_distributed_sampler(loader: Any) -> DistributedSampler[Any] | None:
    """The loader's ``DistributedSampler`` when the position can be translated, else None.

    Only the exact class qualifies (a subclass may order its samples differently), under the
    default ``BatchSampler``, so that a rank's batch ``k`` holds its samples ``k*B ... k*B+B-1``.
    """
    if not isinstance(loader, DataLoader) or type(loader.batch_sampler) is not BatchSampler:
        return None
    sampler = loader.batch_sampler.sampler
    return sampler if type(sampler) is DistributedSampler else None


def global_order(size: int, *, seed: int, shuffle: bool, epoch: int) -> list[int]:
    """An epoch's order of all indices before padding, as DistributedSampler draws it.

    It depends on the seed and the epoch only, never on the replica count: what makes a position
    in it meaningful across world sizes.
    """
    if not shuffle:
        return list(range(size))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(size, generator=generator).tolist()


class RemainderSampler(Sampler[int]):
    """This rank's share of the epoch's global order after its first ``skip`` positions.

    Args:
        order: The epoch's global order (:func:`global_order`).
        skip: Positions already consumed by the previous replicas.
        num_replicas: The replica count now.
        rank: This replica's rank now.
        drop_last: DistributedSampler's ``drop_last``: drop the tail that does not divide by
            ``num_replicas`` instead of padding it with the first remaining samples.
    """

    def __init__(self, order: list[int], skip: int, *, num_replicas: int, rank: int, drop_last: bool) -> None:
        rest = order[min(skip, len(order)) :]
        if drop_last:
            rest = rest[: len(rest) - len(rest) % num_replicas]
        elif rest and len(rest) % num_replicas:
            total = math.ceil(len(rest) / num_replicas) * num_replicas
            rest = (rest * math.ceil(total / len(rest)))[:total]
        self.indices = rest[rank::num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True)
class Regrouped:
    """The rest of an epoch split over a new replica count.

    Attributes:
        loader: Iterates this rank's remaining batches.
        start: The batch index the rest starts at (``len(full loader) - len(loader)``), so the rest
            ends where a full epoch at the new count ends and "last batch of the epoch" (epoch-end
            validation, a final partial accumulation window) stays where it belongs.
        skip: Global positions consumed before the rest.
        per_rank: Samples of the rest this rank reads (padding included).
        num_replicas: The replica count now.
        batch_size: Samples per batch.
        order: The settings that drew the epoch's order (``size``, ``seed``, ``shuffle``, ``drop_last``).
    """

    loader: DataLoader[Any]
    start: int
    skip: int
    per_rank: int
    num_replicas: int
    batch_size: int
    order: dict[str, Any]


def record_position(loader: Any, batches_done: int, regrouped: Regrouped | None) -> dict[str, Any] | None:
    """The epoch's data position for a checkpoint: global positions consumed, replicas, order settings.

    None when the order is not a DistributedSampler's (it cannot be translated to another count).
    """
    if regrouped is not None:
        read = min(max(0, batches_done - regrouped.start) * regrouped.batch_size, regrouped.per_rank)
        return {
            **regrouped.order,
            "samples_done": regrouped.skip + read * regrouped.num_replicas,
            "replicas": regrouped.num_replicas,
            "regrouped": True,
        }
    sampler = find_distributed_sampler(loader)
    if sampler is None:
        return None
    read = min(batches_done * loader.batch_sampler.batch_size, sampler.num_samples)
    return {
        "size": len(sampler.dataset),  # type: ignore[arg-type]
        "seed": sampler.seed,
        "shuffle": sampler.shuffle,
        "drop_last": sampler.drop_last,
        "samples_done": read * sampler.num_replicas,
        "replicas": sampler.num_replicas,
        "regrouped": False,
    }


def needs_regroup(record: dict[str, Any] | None, loader: Any) -> bool:
    """Whether resuming must split the rest of the epoch anew (else the batch-level skip is exact).

    True when the replica count changed, or when the checkpoint's epoch was itself regrouped (its
    batches no longer line up with a plain skip).
    """
    if not record:
        return False
    sampler = find_distributed_sampler(loader)
    replicas = 1 if sampler is None else sampler.num_replicas
    return bool(record.get("regrouped")) or record.get("replicas") != replicas


def regroup(loader: Any, record: dict[str, Any], epoch: int) -> Regrouped | None:
    """This rank's rest of epoch ``epoch`` after ``record["samples_done"]`` global positions.

    With one replica now the loader has no DistributedSampler (nothing to shard); the rest is then
    taken from the checkpoint's order, as a DistributedSampler over one replica would.

    Returns:
        None when it cannot be done exactly: a loader phalanx cannot rebuild, or a dataset whose
        length changed.
    """
    from phalanx.strategies._distributed import replace_sampler

    sampler = find_distributed_sampler(loader)
    if sampler is not None:
        replicas, rank, drop_last = sampler.num_replicas, sampler.rank, sampler.drop_last
    elif (
        type(loader) is DataLoader
        and type(loader.batch_sampler) is BatchSampler
        and not isinstance(loader.dataset, IterableDataset)
    ):
        replicas, rank, drop_last = 1, 0, bool(record["drop_last"])
    else:
        return None
    if len(loader.dataset) != record["size"]:  # type: ignore[arg-type]
        return None
    order = global_order(int(record["size"]), seed=int(record["seed"]), shuffle=bool(record["shuffle"]), epoch=epoch)
    skip = int(record["samples_done"])
    rest = RemainderSampler(order, skip, num_replicas=replicas, rank=rank, drop_last=drop_last)
    remaining = replace_sampler(loader, rest)
    settings = {key: record[key] for key in ("size", "seed", "shuffle", "drop_last")}
    return Regrouped(
        loader=remaining,
        start=max(0, len(loader) - len(remaining)),
        skip=skip,
        per_rank=len(rest),
        num_replicas=replicas,
        batch_size=int(loader.batch_sampler.batch_size),
        order=settings,
    )


def regroup_resumed_epoch(loader: Any, resume: dict[str, Any], epoch: int, accumulate: int) -> Regrouped | None:
    """The fit loop's resume decision: the rest of the epoch regrouped, or None for the batch-level skip.

    None (the skip, exact and bit-identical to an uninterrupted run) when the replica count is the
    one the checkpoint was saved on, or the epoch had ended. Warns when regrouping is needed but
    impossible, and when it changes an accumulation window's batches.
    """
    position = resume.get("position")
    if resume["phase"] == "epoch_end" or not needs_regroup(position, loader):
        return None
    assert position is not None
    regrouped = regroup(loader, position, epoch)
    if regrouped is None:
        warnings.warn(
            f"The checkpoint was saved mid-epoch on {position['replicas']} data-parallel replicas; this run's "
            "training loader cannot be regrouped (not a plain DataLoader, or its dataset length changed), so each "
            f"rank skips {resume['batches_done']} batches of its new shard and the rest of this epoch differs.",
            stacklevel=4,
        )
    elif resume["batches_done"] % accumulate:
        warnings.warn(
            f"The checkpoint was saved inside an accumulation window (batch {resume['batches_done']}, "
            f"accumulate_grad_batches={accumulate}) on {position['replicas']} replicas; on the new replica count "
            "the window's remaining batches are regrouped, so that optimizer step differs from the original run.",
            stacklevel=4,
        )
    return regrouped
