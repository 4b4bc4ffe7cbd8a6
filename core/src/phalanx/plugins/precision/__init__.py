"""``lightning.pytorch.plugins.precision``: the precision plugins (phalanx's :mod:`phalanx.precision`).

``XLAPrecision`` comes from ``phalanx-strategy-xla`` when installed. Names resolve on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.precision.amp import MixedPrecision
    from phalanx.precision.double import DoublePrecision
    from phalanx.precision.half import HalfPrecision
    from phalanx.precision.precision import Precision

__all__ = ["DoublePrecision", "HalfPrecision", "MixedPrecision", "Precision"]

_WHERE = {
    "DoublePrecision": "phalanx.precision.double",
    "HalfPrecision": "phalanx.precision.half",
    "MixedPrecision": "phalanx.precision.amp",
    "Precision": "phalanx.precision.precision",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    if name == "XLAPrecision":
        from phalanx._registered_classes import registered_class

        return registered_class(name, module=__name__)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
