"""``lightning.pytorch.strategies.ddp``: :class:`DDPStrategy`, from the ``phalanx-strategy-ddp`` plugin package.

The class lives in the plugin package (the core never imports one); this module resolves the name
through the strategy registry on first access, exactly as ``from phalanx.strategies import DDPStrategy``
does, and without the package the ImportError names what to install.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    if name == "DDPStrategy":
        from phalanx._registered_classes import registered_class

        return registered_class(name, module=__name__)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
