"""Dataloaders: where they come from, how many batches count, distributed samplers, resuming.

The Trainer accepts any iterable of batches; ``torch.utils.data.DataLoader`` gets extra care. With
several processes its sampler is replaced by a ``DistributedSampler`` so each rank sees its own
shard. On a mid-epoch resume the already-consumed batches are skipped at the *sampler* level, so no
data is loaded twice and the remaining batches are exactly those of the uninterrupted run.

Several training dataloaders (a dict or list of them) are combined as Lightning combines them, into
a ``CombinedLoader`` in ``"max_size_cycle"`` mode; a ``CombinedLoader`` given as a dataloader has each
of its loaders sharded and is iterated for its combined batches. For evaluation, a dict of
dataloaders or a sequential ``CombinedLoader`` is several dataloaders (``dataloader_idx`` in order).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Iterable, Iterator, Sized
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, SequentialSampler

from phalanx.datamodule import DataModule
from phalanx.errors import MisconfigurationError
from phalanx.module import Module
from phalanx.utilities.combined_loader import CombinedLoader
from phalanx.utilities.model_helpers import is_overridden
from phalanx.utilities.seed import add_worker_init_fn

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = [
    "CombinedBatches",
    "SkipBatchSampler",
    "as_loader_list",
    "generators_of",
    "iterate_skipping",
    "limit_batches",
    "num_batches",
    "prepare_loader",
    "reload_train_loader",
    "resolve_loaders",
    "set_sampler_epoch",
    "with_last",
]

_REBUILD_SKIP = {"dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"}


def _is_loader_like(value: Any) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, torch.Tensor))


def as_loader_list(value: Any, *, argument: str, multiple: bool) -> list[Any]:
    """Normalise a user's dataloader argument to a list of iterables.

    For evaluation a list/tuple or dict of DataLoaders, or a sequential ``CombinedLoader``, means
    several dataloaders; for training, several DataLoaders become one ``"max_size_cycle"``
    ``CombinedLoader`` (Lightning's default). Any other iterable is one dataloader (a list of
    batches works too).

    Raises:
        MisconfigurationError: ``value`` is not iterable.
    """
    if isinstance(value, CombinedLoader):
        return list(value.flattened) if multiple and value.mode == "sequential" else [value]
    if multiple and isinstance(value, dict) and value and all(isinstance(v, DataLoader) for v in value.values()):
        return list(value.values())
    if multiple and isinstance(value, (list, tuple)) and value and all(isinstance(v, DataLoader) for v in value):
        return list(value)
    if not multiple and isinstance(value, (list, tuple)) and value and all(isinstance(v, DataLoader) for v in value):
        return [value[0]] if len(value) == 1 else [CombinedLoader(list(value), "max_size_cycle")]
    if not multiple and isinstance(value, dict) and value and all(isinstance(v, DataLoader) for v in value.values()):
        return [CombinedLoader(value, "max_size_cycle")]
    if not _is_loader_like(value):
        msg = (
            f"{argument}={value!r} (type {type(value).__name__}) is not an iterable of batches; pass a "
            "torch.utils.data.DataLoader (or a list of them for evaluation)."
        )
        raise MisconfigurationError(msg)
    return [value]


def num_batches(loader: Any) -> float:
    """``len(loader)``, or ``inf`` for loaders without a length (iterable datasets)."""
    if isinstance(loader, Sized):
        try:
            return float(len(loader))
        except TypeError:
            return math.inf
    return math.inf


def limit_batches(limit: int | float, total: float, *, name: str) -> float:
    """Apply ``limit_*_batches`` (a count, or a fraction of ``total``).

    Raises:
        MisconfigurationError: A fraction other than 0/1 for a loader without length, or a fraction
            so small it rounds to zero batches.
    """
    if isinstance(limit, int):
        return float(min(total, limit))
    if limit == 1.0:
        return total
    if limit == 0.0:
        return 0.0
    if math.isinf(total):
        msg = (
            f"Trainer({name}={limit}) is a fraction, but the dataloader has no length (an iterable dataset). "
            f"Pass an int count instead, e.g. {name}=100."
        )
        raise MisconfigurationError(msg)
    count = int(total * limit)
    if count == 0:
        msg = (
            f"Trainer({name}={limit}) of {int(total)} batches rounds to 0 batches. Pass a larger fraction "
            f"(at least {1 / total:.3g}) or an int count."
        )
        raise MisconfigurationError(msg)
    return float(count)


def _rebuild(loader: DataLoader, **changes: Any) -> DataLoader:
    """A new plain DataLoader with the same settings as ``loader`` except ``changes``."""
    params = inspect.signature(DataLoader.__init__).parameters
    kwargs = {
        name: getattr(loader, name)
        for name in params
        if name not in _REBUILD_SKIP and name != "self" and hasattr(loader, name)
    }
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    kwargs.update(changes)
    return DataLoader(loader.dataset, **kwargs)


def _rebuildable(loader: Any) -> bool:
    return type(loader) is DataLoader and loader.batch_sampler is not None


def prepare_loader(
    loader: Any,
    strategy: Any,
    *,
    use_distributed_sampler: bool,
    shuffle: bool | None = None,
    sequential: bool = False,
    prefix: str = "train",
) -> Any:
    """Shard the data when several processes share it, then let the strategy wrap the loader.

    The shard comes from the strategy's ``distributed_sampler_kwargs`` (None: every process reads
    everything), so phalanx shards exactly like a hand-written ``DistributedSampler(seed=0)`` loop;
    ``shuffle=None`` keeps the loader's own choice (a RandomSampler shuffles); ``sequential=True``
    (``overfit_batches``) reads in order in every case: any other sampler is replaced by a
    ``SequentialSampler``, with a warning naming the ``prefix`` dataloader ("train", "val"), as Lightning does.
    """
    if sequential:
        shuffle = False
    if isinstance(loader, CombinedLoader):
        loader.flattened = [
            prepare_loader(
                inner,
                strategy,
                use_distributed_sampler=use_distributed_sampler,
                shuffle=shuffle,
                sequential=sequential,
                prefix=prefix,
            )
            for inner in loader.flattened
        ]
        return CombinedBatches(loader)
    shard = strategy.distributed_sampler_kwargs
    if use_distributed_sampler and shard is not None and shard["num_replicas"] > 1:
        from phalanx.strategies._distributed import inject_distributed_sampler

        loader = inject_distributed_sampler(loader, shuffle, **shard)
    elif sequential and isinstance(loader, DataLoader) and not isinstance(loader.sampler, SequentialSampler):
        from phalanx.strategies._distributed import replace_sampler

        warnings.warn(
            f"You requested to overfit but enabled {prefix} dataloader shuffling. We are turning off the {prefix} "
            f"dataloader shuffling for you (its {type(loader.sampler).__name__} is replaced by a SequentialSampler).",
            UserWarning,
            stacklevel=2,
        )
        loader = replace_sampler(loader, SequentialSampler(loader.dataset))  # type: ignore[arg-type]
    add_worker_init_fn(loader, rank=strategy.global_rank)  # seed_everything(workers=True): distinct worker seeds
    return strategy.process_dataloader(loader)


class CombinedBatches:
    """A :class:`CombinedLoader` as the loops iterate it: its combined batches only.

    ``CombinedLoader`` yields ``(batch, batch_idx, dataloader_idx)``; the loops count batches
    themselves, so this view drops the two indices. Its length is the combined loader's, and the
    inner loaders' samplers are reachable (:func:`set_sampler_epoch`, :func:`generators_of`).
    """

    def __init__(self, combined: CombinedLoader) -> None:
        self.combined = combined

    def __iter__(self) -> Iterator[Any]:
        return (batch for batch, _, _ in iter(self.combined))

    def __len__(self) -> int:
        iter(self.combined)  # a pass's length; no iterator of the inner loaders is made before next()
        return len(self.combined)


def _samplers(loader: Any) -> list[Any]:
    if isinstance(loader, CombinedBatches):
        return [sampler for inner in loader.combined.flattened for sampler in _samplers(inner)]
    found: list[Any] = []
    for obj in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if obj is not None and all(obj is not seen for seen in found):
            found.append(obj)
    return found


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """Tell epoch-aware samplers (DistributedSampler) the epoch, so shuffling differs per epoch."""
    for sampler in _samplers(loader):
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)


def generators_of(loader: Any) -> list[torch.Generator]:
    """The ``torch.Generator`` objects that decide a loader's order (saved for exact resume)."""
    found: list[torch.Generator] = []
    for obj in (loader, *_samplers(loader)):
        generator = getattr(obj, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


class SkipBatchSampler:
    """Wraps a batch sampler and drops its first ``skip`` batches of indices.

    Skipping happens lazily at the first ``next`` (exactly when the wrapped sampler would draw its
    shuffle seed in an uninterrupted run) or when :meth:`prime` forces it, so the random draws
    happen in the same order as in the original run.
    """

    def __init__(self, inner: Any, skip: int) -> None:
        self.inner = inner
        self.skip = skip
        self._pending: _SkipIterator | None = None

    def __iter__(self) -> Iterator[list[int]]:
        self._pending = _SkipIterator(self.inner, self.skip)
        return self._pending

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.skip)

    def prime(self) -> None:
        """Perform the pending skip now (draws the shuffle seed before RNG state is restored)."""
        if self._pending is not None:
            self._pending.start()


class _SkipIterator:
    def __init__(self, inner: Any, skip: int) -> None:
        self._inner = inner
        self._skip = skip
        self._it: Iterator[Any] | None = None

    def start(self) -> None:
        if self._it is None:
            self._it = iter(self._inner)
            for _ in range(self._skip):
                if next(self._it, None) is None:
                    break

    def __iter__(self) -> _SkipIterator:
        return self

    def __next__(self) -> Any:
        self.start()
        assert self._it is not None
        return next(self._it)


def iterate_skipping(loader: Any, skip: int) -> Iterator[Any]:
    """An iterator over ``loader`` without its first ``skip`` batches.

    A plain map-style DataLoader is rebuilt around :class:`SkipBatchSampler` (no data is loaded for
    skipped batches, workers included); any other iterable has its first batches fetched and dropped.
    """
    if skip <= 0:
        return iter(loader)
    if _rebuildable(loader):
        wrapper = SkipBatchSampler(loader.batch_sampler, skip)
        iterator = iter(_rebuild(loader, batch_sampler=wrapper))
        wrapper.prime()
        return iterator
    iterator = iter(loader)
    for _ in range(skip):
        if next(iterator, _EXHAUSTED) is _EXHAUSTED:
            break
    return iterator


_EXHAUSTED = object()


def resolve_loaders(run: Run, given: Any, hook: str, argument: str, *, multiple: bool) -> list[Any]:
    """The dataloaders given to the entry point, else the DataModule's, else the Module's."""
    if given is None:
        datamodule = run.datamodule
        if datamodule is not None and is_overridden(hook, datamodule, DataModule):
            given = getattr(datamodule, hook)()
        elif getattr(run.module, hook, None) is not None and is_overridden(hook, type(run.module), Module):
            # ``model.val_dataloader = None`` on the instance means "no such loader", as in Lightning
            given = run.hooks.call_module(hook)
        if given is None:
            return []
    return as_loader_list(given, argument=argument, multiple=multiple)


def reload_train_loader(run: Run) -> Any:
    """The training dataloader again (``reload_dataloaders_every_n_epochs``), or None when it was given."""
    if run.train_loader_given:
        return None
    loaders = resolve_loaders(run, None, "train_dataloader", "train_dataloaders", multiple=False)
    return loaders[0] if loaders else None


def with_last(iterator: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """Yield ``(batch, is_last)`` with one batch of lookahead (for loaders without a length)."""
    try:
        previous = next(iterator)
    except StopIteration:
        return
    for item in iterator:
        yield previous, False
        previous = item
    yield previous, True
