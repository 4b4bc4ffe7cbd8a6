"""CombinedLoader: iterate several dataloaders as one, in one of four modes (Lightning's class).

The dataloaders come as any nesting of dicts, lists and tuples (``{"a": loader_a, "b": loader_b}``);
each combined batch has that same structure with a batch of each loader in place of the loader.
Iterating yields ``(batch, batch_idx, dataloader_idx)``:

=====================  =======================================================================
mode                   what one pass yields
=====================  =======================================================================
``"min_size"``         combined batches until the shortest loader is exhausted
``"max_size_cycle"``   combined batches until the longest is exhausted; shorter ones restart
``"max_size"``         combined batches until the longest is exhausted; exhausted ones give None
``"sequential"``       every batch of the first loader, then of the second, ...; each batch
                       alone, with its own ``batch_idx`` and the loader's ``dataloader_idx``
=====================  =======================================================================

``len()`` (after ``iter()``) is the number of batches one pass yields; ``limits`` caps each
loader's batches (``limit_*_batches``) in ``len()``, and in a sequential pass also in iteration (in
the other modes the Trainer stops after ``len()`` batches). The Trainer accepts one as a dataloader: training uses the
combined batches (a dict or list of training loaders becomes a ``"max_size_cycle"`` one, as in
Lightning), evaluation runs a ``"sequential"`` one as separate dataloaders.

A container whose items are all plain numbers or strings (``[1, 2, 3]``) is one iterable, not a
collection of iterables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["CombinedLoader"]

Mode = Literal["min_size", "max_size_cycle", "max_size", "sequential"]
_MODES: dict[str, Callable[[list[float]], float]] = {
    "min_size": min,
    "max_size_cycle": max,
    "max_size": max,
    "sequential": sum,
}


def _one_iterable(node: Any) -> bool:
    """Whether a container is a single iterable of plain values rather than a collection of loaders."""
    if isinstance(node, Mapping):
        children: Iterable[Any] = node.values()
    elif isinstance(node, (list, tuple)):
        children = node
    else:
        return False
    return all(isinstance(child, (int, float, str)) for child in children)


def _length(iterable: Any) -> float:
    """``len(iterable)``, or infinity for an iterable without a (working) length."""
    try:
        return float(len(iterable))
    except (TypeError, NotImplementedError):
        return float("inf")


class _Pass:
    """One pass over the flattened loaders in a given mode; yields ``(flat batches, batch_idx, dataloader_idx)``."""

    def __init__(self, iterables: list[Any], mode: str, limits: list[float] | None) -> None:
        self.iterables = iterables
        self.mode = mode
        self.limits = limits
        self.iterators: list[Iterator[Any]] | None = None  # made on the first next(): no worker starts before
        self.exhausted = [False] * len(iterables)
        self.batch_idx = 0
        self.dataloader_idx = 0

    def _start(self) -> list[Iterator[Any]]:
        if self.iterators is None:
            if self.mode != "sequential":
                self.iterators = [iter(iterable) for iterable in self.iterables]
            else:
                self.iterators = [iter(self.iterables[0])] if self.iterables else []
        return self.iterators

    def length(self) -> float:
        """Batches this pass yields, limits applied; infinite when a loader without a length decides it."""
        lengths = [_length(iterable) for iterable in self.iterables]
        if self.limits is not None:
            lengths = [min(length, limit) for length, limit in zip(lengths, self.limits)]
        return _MODES[self.mode](lengths) if lengths else 0.0

    def __next__(self) -> tuple[Any, int, int]:
        iterators = self._start()
        if self.mode == "sequential":
            return self._next_sequential()
        if not iterators:
            raise StopIteration
        if self.mode == "min_size":
            out = [next(iterator) for iterator in iterators]
        elif self.mode == "max_size_cycle":
            out = [self._next_cycling(i) for i in range(len(iterators))]
        else:
            out = [self._next_or_none(i) for i in range(len(iterators))]
            if all(self.exhausted):
                raise StopIteration
        index, self.batch_idx = self.batch_idx, self.batch_idx + 1
        return out, index, 0

    def _next_cycling(self, i: int) -> Any:
        iterators = self._start()
        try:
            return next(iterators[i])
        except StopIteration:
            self.exhausted[i] = True
            if all(self.exhausted):
                raise
            iterators[i] = iter(self.iterables[i])
            return next(iterators[i])

    def _next_or_none(self, i: int) -> Any:
        with contextlib.suppress(StopIteration):
            return next(self._start()[i])
        self.exhausted[i] = True
        return None

    def _next_sequential(self) -> tuple[Any, int, int]:
        while self.dataloader_idx < len(self.iterables):
            limit = self.limits[self.dataloader_idx] if self.limits is not None else float("inf")
            if self.batch_idx < limit:
                with contextlib.suppress(StopIteration):
                    batch = next(self._start()[0])
                    index, self.batch_idx = self.batch_idx, self.batch_idx + 1
                    return batch, index, self.dataloader_idx
            self.dataloader_idx += 1
            self.batch_idx = 0
            self.iterators = (
                [iter(self.iterables[self.dataloader_idx])] if self.dataloader_idx < len(self.iterables) else []
            )
        raise StopIteration


class CombinedLoader(Iterable[Any]):
    """Iterate a collection of dataloaders (or any iterables) together; see the module docstring.

    Args:
        iterables: One iterable, or dicts / lists / tuples of them, nested as you like.
        mode: ``"min_size"`` (the default), ``"max_size_cycle"``, ``"max_size"`` or ``"sequential"``.

    Raises:
        ValueError: An unknown mode.
    """

    def __init__(self, iterables: Any, mode: Mode = "min_size") -> None:
        if mode not in _MODES:
            msg = f"CombinedLoader(mode={mode!r}) is not a mode; pass one of {list(_MODES)}"
            raise ValueError(msg)
        self._iterables = iterables
        self._flattened, self._spec = tree_flatten(iterables, is_leaf=_one_iterable)
        self._mode = mode
        self._limits: list[float] | None = None
        self._pass: _Pass | None = None

    @property
    def mode(self) -> str:
        """The combination mode."""
        return self._mode

    @property
    def iterables(self) -> Any:
        """The collection of iterables, as given (or as :attr:`flattened` last replaced them)."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list, in the collection's order."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        """Replace the iterables (e.g. with sharded copies), keeping the collection's structure.

        Raises:
            ValueError: ``flattened`` does not hold one iterable for each current one.
        """
        if len(flattened) != len(self._flattened):
            msg = f"flattened holds {len(flattened)} iterables; this CombinedLoader has {len(self._flattened)}: pass one for each"
            raise ValueError(msg)
        self._flattened = list(flattened)
        self._iterables = tree_unflatten(self._flattened, self._spec)

    @property
    def sampler(self) -> Any:
        """Each iterable's ``sampler`` (None where it has none), in the collection's structure."""
        return tree_unflatten([getattr(it, "sampler", None) for it in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        """Each iterable's ``batch_sampler`` (None where it has none), in the collection's structure."""
        return tree_unflatten([getattr(it, "batch_sampler", None) for it in self._flattened], self._spec)

    @property
    def limits(self) -> list[float] | None:
        """The most batches taken from each iterable per pass (None: no limit)."""
        return self._limits

    @limits.setter
    def limits(self, limits: float | list[float] | None) -> None:
        """One limit for all iterables, one per iterable, or None.

        Raises:
            ValueError: A list whose length is not the number of iterables.
        """
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            msg = f"limits holds {len(limits)} values; this CombinedLoader has {len(self._flattened)} iterables: pass one each"
            raise ValueError(msg)
        self._limits = limits

    def __iter__(self) -> CombinedLoader:
        self._pass = _Pass(self._flattened, self._mode, self._limits)
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self._pass is None:
            msg = "call iter(combined_loader) before next()"
            raise RuntimeError(msg)
        batch, batch_idx, dataloader_idx = next(self._pass)
        if self._mode != "sequential":
            batch = tree_unflatten(batch, self._spec)
        return batch, batch_idx, dataloader_idx

    def __len__(self) -> int:
        """Batches one pass yields (infinite loaders count as such: ``len`` raises then).

        Raises:
            RuntimeError: ``iter()`` has not been called yet (as in Lightning).
            TypeError: The length is infinite (an iterable without a length decides it).
        """
        if self._pass is None:
            msg = "call iter(combined_loader) before len(): the length belongs to a pass"
            raise RuntimeError(msg)
        length = self._pass.length()
        if length == float("inf"):
            msg = "this CombinedLoader has no length: a loader without one (an iterable dataset) decides it"
            raise TypeError(msg)
        return int(length)

    def reset(self) -> None:
        """End the current pass and drop the iterables' iterators (their worker processes stop)."""
        self._pass = None
        for iterable in self._flattened:
            iterator = getattr(iterable, "_iterator", None)
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if callable(shutdown):
                shutdown()
            if iterator is not None:
                iterable._iterator = None

    def _dataset_length(self) -> int:
        """The datasets' combined length in this mode (sum for sequential, else min or max).

        Raises:
            NotImplementedError: No iterable has a dataset with a length.
        """
        lengths = [_length(getattr(iterable, "dataset", None)) for iterable in self._flattened]
        finite = [length for length in lengths if length != float("inf")]
        if not finite:
            msg = "no iterable of this CombinedLoader has a dataset with a length (all are iterable-style)"
            raise NotImplementedError(msg)
        return int(_MODES[self._mode](finite))
