"""Batches and dataloaders: the size of a batch, and whether a dataloader's length can be trusted.

``self.log`` weights an epoch mean by batch size; when the caller gives none, the size is read
from the batch itself: the first dimension of the first tensor found, at any depth of dicts,
sequences and dataclasses. :func:`extract_batch_size` is that search, under Lightning's name, and
it warns when the tensors disagree (``self.log(..., batch_size=n)`` removes the doubt).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Generator, Iterable, Mapping
from typing import Any, TypeAlias

import torch
from torch.utils.data import DataLoader, IterableDataset

from phalanx.errors import MisconfigurationError
from phalanx.utilities.rank_zero import rank_zero_warn

__all__ = ["BType", "extract_batch_size", "has_len_all_ranks", "suggested_max_num_workers"]

#: What a batch may be: tensors and strings, nested in mappings and iterables (dataclasses too).
BType: TypeAlias = torch.Tensor | str | Mapping[Any, "BType"] | Iterable["BType"]

_NO_SIZE = (
    "Could not infer the batch size from the batch: no tensor found (or the structure is too deep). "
    "Fix: pass it, self.log(..., batch_size=n), or simplify the batch."
)


def _sizes(batch: Any) -> Generator[int | None, None, None]:
    if isinstance(batch, torch.Tensor):
        yield int(batch.size(0)) if batch.ndim else 1
    elif isinstance(batch, (Iterable, Mapping)) and not isinstance(batch, str):
        for item in batch.values() if isinstance(batch, Mapping) else batch:
            yield from _sizes(item)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for item in dataclasses.fields(batch):
            yield from _sizes(getattr(batch, item.name))
    else:
        yield None


def extract_batch_size(batch: BType) -> int:
    """The batch size: the first dimension of the first tensor in ``batch`` (1 for a 0-d tensor).

    Warns once the tensors disagree on it, and keeps the first.

    Raises:
        MisconfigurationError: No tensor in ``batch``.
        RecursionError: The batch nests too deeply to search.
    """
    found: int | None = None
    try:
        for size in _sizes(batch):
            if found is None:
                found = size
            elif size is not None and size != found:
                warnings.warn(
                    f"The batch size is ambiguous: the batch holds tensors of first dimension {found} and {size}; "
                    f"{found} is used. Fix: self.log(..., batch_size=n).",
                    UserWarning,
                    stacklevel=2,
                )
                break
    except RecursionError as error:
        raise RecursionError(_NO_SIZE) from error
    if found is None:
        raise MisconfigurationError(_NO_SIZE)
    return found


def has_len_all_ranks(
    dataloader: object, strategy: Any, allow_zero_length_dataloader_with_multiple_devices: bool = False
) -> bool:
    """Whether ``dataloader`` has a length on this rank, checked against the other ranks' lengths.

    Warns when every rank's dataloader is empty, or when an iterable dataset reports a length (with
    several workers that length is only right if each worker reads its own part).

    Raises:
        RuntimeError: This rank's dataloader is empty while others are not, unless
            ``allow_zero_length_dataloader_with_multiple_devices``.
    """
    try:
        local = len(dataloader)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError):
        return False
    total = strategy.reduce(torch.tensor(local, device=strategy.root_device), reduce_op="sum")
    name = type(dataloader).__name__
    if total == 0:
        rank_zero_warn(f"The {name} is empty on every rank (total length 0); make sure that is intended.")
    elif local == 0:
        if not allow_zero_length_dataloader_with_multiple_devices:
            msg = (
                f"The {name} of this rank has no batches while other ranks have some. Fix: give every rank at least "
                "one batch, or set allow_zero_length_dataloader_with_multiple_devices = True on the Module."
            )
            raise RuntimeError(msg)
        rank_zero_warn(f"The {name} of this rank has no batches while other ranks have some; batch counts are uneven.")
    if isinstance(dataloader, DataLoader) and isinstance(dataloader.dataset, IterableDataset):
        rank_zero_warn(
            "The IterableDataset defines __len__: with several DataLoader workers that length is only right if each "
            "worker reads its own part of the data."
        )
    return True


def suggested_max_num_workers(local_world_size: int) -> int:
    """An upper bound for a DataLoader's ``num_workers``: this machine's usable CPU cores shared among
    its ``local_world_size`` processes, less one core each for the process itself (at least 1).

    Raises:
        ValueError: ``local_world_size`` is below 1.
    """
    if local_world_size < 1:
        msg = f"suggested_max_num_workers(local_world_size={local_world_size}): pass the processes on this machine (1 or more)"
        raise ValueError(msg)
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // local_world_size - 1)
