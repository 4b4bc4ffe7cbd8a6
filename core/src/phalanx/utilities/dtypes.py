"""Float dtype helpers shared by every precision, the core's and the plugins' alike.

A precision casts a batch's floating-point tensors and makes new tensors default to its dtype
while a module is built. Each precision (core ``double``/``half``, DeepSpeed's, XLA's) needs the
exact same two operations, and they must agree, or a batch cast by one precision would not match
weights initialised by another. So they live here once, in a public module plugins may import.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import torch

from phalanx.utilities.apply_func import apply_to_collection

__all__ = ["cast_floats", "default_dtype"]


@contextmanager
def default_dtype(dtype: torch.dtype) -> Generator[None, None, None]:
    """Temporarily make ``dtype`` torch's default float type, restoring the previous one.

    The previous default is restored even when the body raises, so a failed ``configure_model``
    cannot leave the rest of the process creating tensors in the wrong dtype.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def cast_floats(data: Any, dtype: torch.dtype) -> Any:
    """Cast floating-point tensors in ``data`` to ``dtype``; integer tensors (labels, ids) stay.

    Only floats are cast because integer tensors carry indices and class labels whose meaning a
    cast would change (or break, for embedding lookups). Containers keep their types.
    """

    def cast(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(dtype) if torch.is_floating_point(tensor) else tensor

    return apply_to_collection(data, torch.Tensor, cast)
