"""``"16-true"`` and ``"bf16-true"``: the whole model in a 16-bit format.

Halves memory for weights, gradients and optimizer state compared with float32, at the cost of
precision in the updates. bfloat16 keeps float32's range, so it trains without loss scaling;
float16 may under/overflow, which is why ``"16-mixed"`` exists.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.utilities.dtypes import cast_floats, default_dtype

__all__ = ["HalfPrecision"]

_DTYPES = {"16-true": torch.float16, "bf16-true": torch.bfloat16}


class HalfPrecision(Precision):
    """Parameters, inputs and newly created float tensors are float16 or bfloat16.

    Args:
        precision: ``"16-true"`` (float16) or ``"bf16-true"`` (bfloat16).

    Raises:
        MisconfigurationError: Any other precision name.
    """

    def __init__(self, precision: str = "16-true") -> None:
        if precision not in _DTYPES:
            msg = (
                f"HalfPrecision(precision={precision!r}) is not supported; valid values are "
                f"{list(_DTYPES)}. For mixed precision use MixedPrecision('16-mixed' or 'bf16-mixed')."
            )
            raise MisconfigurationError(msg)
        self.precision = precision
        self._dtype = _DTYPES[precision]

    @property
    def dtype(self) -> torch.dtype:
        """The 16-bit dtype this precision trains in."""
        return self._dtype

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast floating-point parameters and buffers to the 16-bit dtype, in place."""
        return module.to(dtype=self._dtype)

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors in the batch to the 16-bit dtype so they match the weights."""
        return cast_floats(data, self._dtype)

    def tensor_init_context(self) -> AbstractContextManager[None]:
        """Create float tensors directly in 16 bits: a large model never exists in float32."""
        return default_dtype(self._dtype)

    def module_init_context(self) -> AbstractContextManager[None]:
        """Instantiate modules in 16 bits, for the same memory reason."""
        return default_dtype(self._dtype)

    def forward_context(self) -> AbstractContextManager[None]:
        """Tensors created inside forward default to the 16-bit dtype too."""
        return default_dtype(self._dtype)
