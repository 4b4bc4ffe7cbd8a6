"""``lightning.pytorch.core`` under the rename rule: the Module and the DataModule.

``from lightning.pytorch.core import LightningModule`` becomes ``from phalanx.core import Module``.
The classes live in :mod:`phalanx.module` and :mod:`phalanx.datamodule`; this package and its
modules (``module``, ``datamodule``, ``hooks``, ``optimizer``, ``saving``, ``mixins``) are the paths a
ported script imports them by. Names resolve on first use, so importing the package costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.datamodule import DataModule
    from phalanx.module import Module

__all__ = ["DataModule", "Module"]

_WHERE = {"Module": "phalanx.module", "DataModule": "phalanx.datamodule"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    msg = f"module 'phalanx.core' has no attribute {name!r}"
    raise AttributeError(msg)
