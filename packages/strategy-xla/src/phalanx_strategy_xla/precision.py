"""Precision on XLA devices: float32, bfloat16 weights ("bf16-true") or bfloat16 autocast.

XLA hardware computes in bfloat16 natively and has no float16 units worth using (nor float64 on
TPU), so only those three formats are offered. The XLA strategies translate the core's generic
``"bf16-true"`` / ``"bf16-mixed"`` precisions into this class and refuse float16 and float64 with
an error naming the fix, instead of silently training in a format the hardware emulates slowly.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.utilities import cast_floats, default_dtype

__all__ = ["SUPPORTED", "XLAPrecision", "to_xla_precision"]

#: Precision names that XLA devices support.
SUPPORTED = ("32-true", "bf16-true", "bf16-mixed")


class XLAPrecision(Precision):
    """float32, bfloat16 weights and compute, or float32 weights with bfloat16 autocast on XLA.

    Args:
        precision: ``"32-true"``, ``"bf16-true"`` or ``"bf16-mixed"``.

    Raises:
        MisconfigurationError: Any other precision (float16 and float64 included).
    """

    def __init__(self, precision: str = "bf16-true") -> None:
        if precision not in SUPPORTED:
            raise MisconfigurationError(_unsupported_message(precision))
        self.precision = precision

    @property
    def dtype(self) -> torch.dtype:
        """The dtype weights are kept in (bfloat16 only for "bf16-true")."""
        return torch.bfloat16 if self.precision == "bf16-true" else torch.float32

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast parameters and buffers to bfloat16 for "bf16-true"; unchanged otherwise."""
        return module.to(dtype=torch.bfloat16) if self.precision == "bf16-true" else module

    def convert_input(self, data: Any) -> Any:
        """Cast float inputs to bfloat16 for "bf16-true" so they match the weights."""
        return cast_floats(data, torch.bfloat16) if self.precision == "bf16-true" else data

    def tensor_init_context(self) -> AbstractContextManager[None]:
        """Create float tensors in bfloat16 for "bf16-true": a large model never exists in float32."""
        return default_dtype(self.dtype)

    def module_init_context(self) -> AbstractContextManager[None]:
        """Instantiate modules in the weight dtype, for the same memory reason."""
        return default_dtype(self.dtype)

    def forward_context(self) -> AbstractContextManager[Any]:
        """bfloat16 autocast on XLA for "bf16-mixed"; default-dtype scope otherwise."""
        if self.precision == "bf16-mixed":
            return torch.autocast("xla", dtype=torch.bfloat16)
        return default_dtype(self.dtype)


def _unsupported_message(precision: str) -> str:
    why = {
        "16-true": "XLA devices have no fast float16 path",
        "16-mixed": "XLA devices have no fast float16 path (and no GradScaler support)",
        "64-true": "TPUs have no float64 units",
    }.get(precision, "it is not a precision XLA supports")
    return (
        f"precision={precision!r} is not supported on XLA devices: {why}. Valid choices: {list(SUPPORTED)}. "
        "Fix: pass precision='bf16-true' (bfloat16 weights and compute) or 'bf16-mixed' (bfloat16 autocast)."
    )


def to_xla_precision(precision: Precision | None) -> Precision | None:
    """The precision an XLA strategy should use in place of ``precision``.

    The core's "bf16-true"/"bf16-mixed" become :class:`XLAPrecision` (their autocast and dtype
    handling target CPU/CUDA). float32 and custom precisions are kept; float16/float64 raise.

    Raises:
        MisconfigurationError: ``precision`` is float16 or float64.
    """
    if precision is None or isinstance(precision, XLAPrecision):
        return precision
    name = str(getattr(precision, "precision", "32-true"))
    if name in ("16-true", "16-mixed", "64-true"):
        raise MisconfigurationError(_unsupported_message(name))
    from phalanx.precision import HalfPrecision, MixedPrecision

    if type(precision) in (HalfPrecision, MixedPrecision) and name in SUPPORTED:
        return XLAPrecision(name)
    return precision
