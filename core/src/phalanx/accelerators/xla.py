"""``lightning.pytorch.accelerators.xla``: ``XLAAccelerator``, from ``phalanx-strategy-xla`` when installed.

TPUs (and XLA:CPU) are a plugin package's business in phalanx; the name resolves through the
accelerator registry, and without the package the ImportError says what to install.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    if name == "XLAAccelerator":
        from phalanx._registered_classes import registered_class

        return registered_class(name, module=__name__)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
