"""``phalanx.loggers.utilities``: Lightning's ``lightning.pytorch.loggers.utilities`` path.

Lightning keeps two helpers here that logger authors (and Lightning's own tests) import: the
checkpoint scan a logger uses to upload new checkpoint files, and the version string of several
loggers together. phalanx keeps the scan in :mod:`phalanx.loggers._params`; these are the same
functions under Lightning's names, so code written against Lightning's module keeps importing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from phalanx.loggers._params import scan_checkpoints

__all__ = ["_scan_checkpoints", "_version", "scan_checkpoints"]

#: Lightning's name for :func:`phalanx.loggers._params.scan_checkpoints`.
_scan_checkpoints = scan_checkpoints


def _version(loggers: Sequence[Any], separator: str = "_") -> int | str:
    """One logger's version, or the versions of several joined by ``separator`` (duplicates once, in order)."""
    if len(loggers) == 1:
        return loggers[0].version  # type: ignore[no-any-return]
    return separator.join(dict.fromkeys(str(logger.version) for logger in loggers))
