"""Byte sizes as people write and read them: ``"80GiB"`` in, ``"2.42 GiB"`` out.

Public through :mod:`phalanx.memory` (``parse_bytes``, ``format_bytes``), where the planner and
``phalanx plan --device-memory`` use them.
"""

from __future__ import annotations

import re

from phalanx.errors import MisconfigurationError

__all__ = ["format_bytes", "parse_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}


def parse_bytes(value: str | int) -> int:
    """``"80GiB"``, ``"24 GB"``, ``"1.5TiB"``, ``"512m"`` or a plain integer -> bytes.

    Raises:
        MisconfigurationError: Not a positive size with a known unit; names the units and an example.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if found and found.group(2).lower() in _UNITS and float(found.group(1)) > 0:
        return int(float(found.group(1)) * _UNITS[found.group(2).lower()])
    msg = (
        f"device memory {value!r} is not a size: expected a positive number with a unit "
        "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB). Pass e.g. --device-memory 80GiB."
    )
    raise MisconfigurationError(msg)


def format_bytes(value: int | None) -> str:
    """Bytes in binary units with three significant digits (``"2.42 GiB"``); ``"-"`` for ``None``."""
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(amount) < 1024 or unit == "TiB":
            if unit == "B" or amount >= 999.5:  # three significant digits would print 1.01e+03
                return f"{amount:.0f} {unit}"
            return f"{amount:.3g} {unit}"
        amount /= 1024
    return f"{amount:.3g} TiB"  # pragma: no cover - loop always returns
