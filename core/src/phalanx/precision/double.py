"""``"64-true"``: everything in float64.

Useful for numerically sensitive work (physics, second-order methods, gradient checks) where
float32 round-off matters more than speed.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from phalanx.precision.precision import Precision
from phalanx.utilities.dtypes import cast_floats, default_dtype

__all__ = ["DoublePrecision"]


class DoublePrecision(Precision):
    """Parameters, inputs and newly created float tensors are float64."""

    precision: str = "64-true"

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast parameters and floating-point buffers to float64 (in place, so optimizers stay valid)."""
        return module.double()

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors in the batch to float64 so they match the weights."""
        return cast_floats(data, torch.float64)

    def tensor_init_context(self) -> AbstractContextManager[None]:
        """Create float tensors as float64 directly instead of converting them afterwards."""
        return default_dtype(torch.float64)

    def forward_context(self) -> AbstractContextManager[None]:
        """Tensors created inside forward (``torch.zeros(...)`` & co.) default to float64 too."""
        return default_dtype(torch.float64)
