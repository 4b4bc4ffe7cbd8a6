"""Data (hybrid) x context x tensor x pipeline x expert parallel training for phalanx on one DeviceMesh.

Public names are imported lazily: discovering this plugin imports the package to reach
``_plugin``, and listing strategies must not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ExpertParallel",
    "GroupedExperts",
    "MeshLayout",
    "MoE",
    "ModelParallelStrategy",
    "StackedExperts",
    "clip_grad_norm_",
    "context_parallel_positions",
]

if TYPE_CHECKING:
    from phalanx_strategy_model_parallel._context_parallel import context_parallel_positions
    from phalanx_strategy_model_parallel._expert_parallel import ExpertParallel, GroupedExperts, MoE, StackedExperts
    from phalanx_strategy_model_parallel._grad_norm import clip_grad_norm_
    from phalanx_strategy_model_parallel._layout import MeshLayout
    from phalanx_strategy_model_parallel.strategy import ModelParallelStrategy

_LAZY = {
    "ExpertParallel": "phalanx_strategy_model_parallel._expert_parallel",
    "GroupedExperts": "phalanx_strategy_model_parallel._expert_parallel",
    "MoE": "phalanx_strategy_model_parallel._expert_parallel",
    "StackedExperts": "phalanx_strategy_model_parallel._expert_parallel",
    "clip_grad_norm_": "phalanx_strategy_model_parallel._grad_norm",
    "MeshLayout": "phalanx_strategy_model_parallel._layout",
    "ModelParallelStrategy": "phalanx_strategy_model_parallel.strategy",
    "context_parallel_positions": "phalanx_strategy_model_parallel._context_parallel",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module 'phalanx_strategy_model_parallel' has no attribute {name!r}; public names: {', '.join(__all__)}"
    raise AttributeError(msg)
