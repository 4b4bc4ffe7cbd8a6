"""``lightning.pytorch.plugins.io.xla_plugin``: ``XLACheckpointIO``, from ``phalanx-strategy-xla`` when installed."""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    if name == "XLACheckpointIO":
        from phalanx._registered_classes import registered_class

        return registered_class(name, module=__name__)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
