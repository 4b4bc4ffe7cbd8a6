"""Mixed precisions with one real bug each; the precision kit must fail every one of them.

All are ``16-mixed`` (float16 autocast and a GradScaler) on the CPU, checked against the plain
PyTorch equivalent ``autocast(float16)`` + ``GradScaler``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from phalanx.precision.amp import MixedPrecision


class Fp16(MixedPrecision):
    """The correct one, under another name: the control the kit must pass."""

    def __init__(self) -> None:
        super().__init__("16-mixed")


class NoAutocast(Fp16):
    """Forgets the autocast region: forward runs in float32."""

    def forward_context(self) -> AbstractContextManager[Any]:
        return nullcontext()


class UnscaledBackward(Fp16):
    """Backpropagates the raw loss but still unscales: float16-sized gradients come out 65536 times too small."""

    def backward(
        self, tensor: torch.Tensor, model: nn.Module | None, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> None:
        tensor.backward(*args, **kwargs)


class SkipsUnscale(Fp16):
    """Steps on the scaled gradients and never skips an overflowed step."""

    def optimizer_step(self, optimizer: Optimizer, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        result = closure()
        optimizer.step()
        return result


class ForgetsScale(Fp16):
    """Saves the scaler's state but ignores it when loading: a resumed run restarts at the initial scale."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        del state_dict
