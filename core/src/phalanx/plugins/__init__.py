"""Lightning's ``lightning.pytorch.plugins`` under the rename rule: precision, checkpoint IO, layer sync.

``from lightning.pytorch.plugins import MixedPrecision, TorchCheckpointIO`` becomes
``from phalanx.plugins import MixedPrecision, TorchCheckpointIO``; the subpackages
(``precision``, ``io``, ``environments``, ``layer_sync``) are Lightning's paths too. The classes
are phalanx's own, from :mod:`phalanx.precision`, :mod:`phalanx.checkpoint_io` and
:mod:`phalanx.environments`, so any of them goes into ``Trainer(plugins=[...])``. ``XLAPrecision``
and ``XLACheckpointIO`` come from the ``phalanx-strategy-xla`` package when it is installed.

Not to be confused with phalanx's *plugin packages* (installable strategies and other components
found through entry points): that machinery is :mod:`phalanx.discovery`, and a plugin package
imports ``phalanx.hookimpl`` and ``phalanx.registry``, never this namespace.

Every name resolves on first use: ``import phalanx.plugins`` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.checkpoint_io.async_io import AsyncCheckpointIO
    from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
    from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
    from phalanx.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
    from phalanx.precision.amp import MixedPrecision
    from phalanx.precision.double import DoublePrecision
    from phalanx.precision.half import HalfPrecision
    from phalanx.precision.precision import Precision

__all__ = [
    "AsyncCheckpointIO",
    "CheckpointIO",
    "DoublePrecision",
    "HalfPrecision",
    "LayerSync",
    "MixedPrecision",
    "Precision",
    "TorchCheckpointIO",
    "TorchSyncBatchNorm",
]

_WHERE = {
    "AsyncCheckpointIO": "phalanx.checkpoint_io.async_io",
    "CheckpointIO": "phalanx.checkpoint_io.checkpoint_io",
    "TorchCheckpointIO": "phalanx.checkpoint_io.torch_io",
    "DoublePrecision": "phalanx.precision.double",
    "HalfPrecision": "phalanx.precision.half",
    "MixedPrecision": "phalanx.precision.amp",
    "Precision": "phalanx.precision.precision",
    "LayerSync": "phalanx.plugins.layer_sync",
    "TorchSyncBatchNorm": "phalanx.plugins.layer_sync",
}

#: Lightning's names for classes a plugin package provides; resolved through the registries.
_FROM_PLUGIN_PACKAGES = ("XLACheckpointIO", "XLAPrecision")


#: Subpackages reachable as attributes (``phalanx.plugins.precision.HalfPrecision``), as in Lightning.
_SUBMODULES = ("io", "layer_sync", "precision")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    if name in _FROM_PLUGIN_PACKAGES:
        from phalanx._registered_classes import registered_class

        return registered_class(name, module=__name__)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
