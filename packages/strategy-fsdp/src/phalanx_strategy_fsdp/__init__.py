"""Fully sharded data parallel strategies for phalanx, on PyTorch's FSDP2 (``fully_shard``).

Public names are imported lazily: discovering this plugin imports the package to reach
``_plugin``, and listing strategies must not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["FSDPStrategy", "ModuleClassPolicy"]

if TYPE_CHECKING:
    from phalanx_strategy_fsdp._policy import ModuleClassPolicy
    from phalanx_strategy_fsdp.strategy import FSDPStrategy

_LAZY = {
    "FSDPStrategy": "phalanx_strategy_fsdp.strategy",
    "ModuleClassPolicy": "phalanx_strategy_fsdp._policy",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module 'phalanx_strategy_fsdp' has no attribute {name!r}; public names: {', '.join(__all__)}"
    raise AttributeError(msg)
