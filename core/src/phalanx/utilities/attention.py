"""Replace ``F.scaled_dot_product_attention`` inside a block: every call, also those inside torch.

Context parallel (split attention over ranks) and the planner's trace (attention as the fused
kernels save it) both need every attention call of a model's forward, whether the model calls
``F.scaled_dot_product_attention`` itself or ``nn.MultiheadAttention`` calls it from torch's own
functional code. A ``TorchFunctionMode`` sees the first kind; the second runs while torch has set
the mode aside (it is inside another torch function's handling), so for the block's duration
``torch.nn.functional``'s name points at the override too, and is put back on exit.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["AttentionOverride", "scaled_dot_product_attention"]

#: torch's own attention, whatever override is active: what an override calls to compute.
scaled_dot_product_attention = F.scaled_dot_product_attention


class AttentionOverride(TorchFunctionMode):
    """A context manager routing every ``F.scaled_dot_product_attention`` call to :meth:`attend`.

    Subclasses implement :meth:`attend` with the SDPA signature; inside it, calls to
    :data:`scaled_dot_product_attention` reach torch's kernel (or, when overrides are nested, the
    next outer override: they compose). :attr:`attending` is true while an override runs. On exit
    torch's name is restored to what it was on entry, so nested overrides unwind in order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.attending = False
        self._previous: Any = None

    def attend(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Compute attention for one ``F.scaled_dot_product_attention(*args, **kwargs)`` call."""
        raise NotImplementedError

    def _route(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.attending = True  # the calls attend makes reach torch's own kernel
        try:
            return self.attend(*args, **kwargs)
        finally:
            self.attending = False

    def __enter__(self) -> AttentionOverride:
        self._previous = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = self._route  # type: ignore[assignment]
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self._previous
        super().__exit__(*exc)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is scaled_dot_product_attention and not self.attending:
            return self._route(*args, **kwargs)
        return func(*args, **kwargs)
