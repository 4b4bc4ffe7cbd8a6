"""Run a function, log or warn on global rank 0 only.

With N processes every ``print``, warning and log line would appear N times; callbacks, loggers
and user code guard them with :func:`rank_zero_only` instead. Names, signatures and ``stacklevel``
numbering are Lightning's (``lightning.pytorch.utilities.rank_zero``), so ported code keeps
pointing its warnings at the same frames.

``rank_zero_only.rank`` starts as the first of ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID`` and
``JSM_NAMESPACE_RANK`` found in the environment (0 when none is), read once at import: a process
launched by torchrun, SLURM or a phalanx launcher is correct before any Trainer exists. A strategy
overwrites it with its global rank when it sets its ranks up.

Importing this module imports no torch (it runs wherever ``phalanx`` does). On first import it
also makes the ``phalanx`` logger show INFO records, as Lightning does for its own: ``rank_zero_info``
and ``seed_everything`` messages are meant to be seen. It sets the level only when the application
left it unset and adds a stderr handler only when the root logger has none.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, Protocol, TypeVar, overload

__all__ = [
    "LightningDeprecationWarning",
    "WarningCache",
    "rank_prefixed_message",
    "rank_zero_debug",
    "rank_zero_deprecation",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
]

#: Environment variables that hold a process's rank, in the order they are trusted. SLURM_PROCID
#: can be set for a job that SLURM does not launch per rank, so the torch variables come first.
RANK_ENV_VARS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")

_T = TypeVar("_T")
_P = ParamSpec("_P")
_PACKAGE_LOGGER = "phalanx"

log = logging.getLogger(__name__)


class LightningDeprecationWarning(DeprecationWarning):
    """A deprecation that phalanx announces (Lightning's category name, kept for ported filters)."""


def _show_info_records() -> None:
    """Let INFO records of phalanx's loggers reach the user, as Lightning's do (see module docstring)."""
    package = logging.getLogger(_PACKAGE_LOGGER)
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)
    if not logging.getLogger().hasHandlers() and not package.handlers:
        package.addHandler(logging.StreamHandler())
        package.propagate = False


_show_info_records()


def rank_from_env() -> int | None:
    """This process's rank from the first of :data:`RANK_ENV_VARS` that is set, or None when none is.

    None (rather than 0) lets messages tell "rank 0 of many" from "not launched as a rank at all".
    """
    for key in RANK_ENV_VARS:
        value = os.environ.get(key)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                msg = f"{key}={value!r} is not an integer rank; set it to this process's rank (0, 1, ...) or unset it"
                raise ValueError(msg) from None
    return None


class _RankZeroOnly(Protocol):
    rank: int

    @overload
    def __call__(self, fn: Callable[_P, _T]) -> Callable[_P, _T | None]: ...
    @overload
    def __call__(self, fn: Callable[_P, _T], default: _T) -> Callable[_P, _T]: ...


def _rank_zero_only(fn: Callable[_P, _T], default: _T | None = None) -> Callable[_P, _T | None]:
    """Decorate ``fn`` to run on global rank 0 only; other ranks get ``default`` (None) back.

    The rank is read from ``rank_zero_only.rank`` at each call, not at decoration time, so
    functions decorated at import follow the rank a strategy sets later.

    Args:
        fn: The function to guard.
        default: What the call returns on the other ranks.
    """

    @wraps(fn)
    def on_rank_zero(*args: _P.args, **kwargs: _P.kwargs) -> _T | None:
        rank = getattr(rank_zero_only, "rank", None)
        if rank is None:
            msg = "rank_zero_only.rank is unset; set it to this process's global rank (int) before calling"
            raise RuntimeError(msg)
        if rank == 0:
            return fn(*args, **kwargs)
        return default

    return on_rank_zero


rank_zero_only: _RankZeroOnly = _rank_zero_only  # type: ignore[assignment]
rank_zero_only.rank = rank_from_env() or 0


# ``stacklevel`` follows Lightning's numbering, where the default attributes the record to the
# caller of ``rank_zero_*``: Lightning's call goes wrapper -> function -> helper -> warnings/logging,
# one frame deeper than ours (wrapper -> function -> warnings/logging), hence the ``- 1``.


@rank_zero_only
def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """Log at DEBUG level on global rank 0 only (arguments as :meth:`logging.Logger.debug`)."""
    log.debug(*args, stacklevel=stacklevel - 1, **kwargs)


@rank_zero_only
def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """Log at INFO level on global rank 0 only (arguments as :meth:`logging.Logger.info`)."""
    log.info(*args, stacklevel=stacklevel - 1, **kwargs)


@rank_zero_only
def rank_zero_warn(message: str | Warning, stacklevel: int = 4, **kwargs: Any) -> None:
    """Emit ``warnings.warn(message, **kwargs)`` on global rank 0 only, pointing at the caller."""
    warnings.warn(message, stacklevel=stacklevel - 1, **kwargs)


def rank_zero_deprecation(message: str | Warning, stacklevel: int = 5, **kwargs: Any) -> None:
    """Emit a :class:`LightningDeprecationWarning` (or ``category=``) on global rank 0 only, pointing at the caller."""
    category = kwargs.pop("category", LightningDeprecationWarning)
    rank_zero_warn(message, stacklevel=stacklevel, category=category, **kwargs)


def rank_prefixed_message(message: str, rank: int | None) -> str:
    """``message`` prefixed with ``[rank: N] `` when ``rank`` is known, unchanged otherwise."""
    return message if rank is None else f"[rank: {rank}] {message}"


class WarningCache(set[str]):
    """Remembers messages already emitted, so a warning raised every step is shown once."""

    def warn(self, message: str, stacklevel: int = 5, **kwargs: Any) -> None:
        """:func:`rank_zero_warn` ``message`` unless this cache has already emitted it."""
        if message not in self:
            self.add(message)
            rank_zero_warn(message, stacklevel=stacklevel, **kwargs)

    def deprecation(self, message: str, stacklevel: int = 6, **kwargs: Any) -> None:
        """:func:`rank_zero_deprecation` ``message`` unless this cache has already emitted it."""
        if message not in self:
            self.add(message)
            rank_zero_deprecation(message, stacklevel=stacklevel, **kwargs)

    def info(self, message: str, stacklevel: int = 5, **kwargs: Any) -> None:
        """:func:`rank_zero_info` ``message`` unless this cache has already emitted it."""
        if message not in self:
            self.add(message)
            rank_zero_info(message, stacklevel=stacklevel, **kwargs)
