"""DeepSpeedPrecision: numeric formats when the DeepSpeed engine owns backward and the step.

With DeepSpeed the engine casts the model (fp16/bf16 in its config), scales the loss, clips and
steps. A regular phalanx precision would autocast, scale and clip a second time, so the strategy
replaces whatever precision the Trainer resolved with this one, keeping its name. Its job is only
to cast inputs to the engine's dtype and to route backward and the step through the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.optim import LBFGS, Optimizer

from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.utilities import cast_floats, default_dtype

__all__ = ["SUPPORTED_PRECISIONS", "DeepSpeedPrecision"]

#: precision name -> dtype the engine computes in.
SUPPORTED_PRECISIONS: dict[str, torch.dtype] = {
    "32-true": torch.float32,
    "16-mixed": torch.float16,
    "bf16-mixed": torch.bfloat16,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
}


class DeepSpeedPrecision(Precision):
    """Route backward and ``optimizer.step`` through the DeepSpeed engine.

    Args:
        precision: One of :data:`SUPPORTED_PRECISIONS` ("64-true" is refused: DeepSpeed has no
            float64 path).

    Raises:
        MisconfigurationError: An unsupported precision name.
    """

    def __init__(self, precision: str = "32-true") -> None:
        if precision not in SUPPORTED_PRECISIONS:
            msg = (
                f"DeepSpeedStrategy does not support precision={precision!r}; valid values are "
                f"{list(SUPPORTED_PRECISIONS)}. Fix: pick one of them, e.g. precision='bf16-mixed' on CPU."
            )
            raise MisconfigurationError(msg)
        self.precision = precision
        self._dtype = SUPPORTED_PRECISIONS[precision]
        self._engine: Any = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the engine's parameters and inputs use."""
        return self._dtype

    def check_device(self, device: torch.device) -> None:
        """Refuse float16 off CUDA before any process group or engine exists.

        DeepSpeed's float16 path (loss scaler, fused kernels) is a CUDA path; bf16 is the CPU choice.
        """
        if self._dtype is torch.float16 and device.type != "cuda":
            msg = (
                f"precision={self.precision!r} (float16) with DeepSpeed needs a CUDA device, but this process "
                f"runs on {str(device)!r}. Fix: use precision='bf16-mixed' (or 'bf16-true') on CPU, or "
                "accelerator='cuda'."
            )
            raise MisconfigurationError(msg)

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast to the 16-bit dtype for the "-true" precisions; the engine casts for "-mixed"."""
        if self.precision.endswith("-true") and self._dtype is not torch.float32:
            return module.to(dtype=self._dtype)
        return module

    def convert_input(self, data: Any) -> Any:
        """Cast float inputs to the engine's dtype: the engine's weights are in it."""
        if self._dtype is torch.float32:
            return data
        return cast_floats(data, self._dtype)

    def tensor_init_context(self) -> AbstractContextManager[Any]:
        """Create tensors in 16 bits for the "-true" precisions (never materialised in float32)."""
        if self.precision.endswith("-true") and self._dtype is not torch.float32:
            return default_dtype(self._dtype)
        return nullcontext()

    def connect(self, model: nn.Module, optimizers: list[Optimizer]) -> tuple[nn.Module, list[Optimizer]]:
        """Remember the engine (the strategy's model) so backward and step can call it."""
        self._engine = model
        return model, optimizers

    def _require_engine(self) -> Any:
        if self._engine is None or not hasattr(self._engine, "backward"):
            msg = (
                "DeepSpeedPrecision has no DeepSpeed engine yet: backward/step were called before "
                "DeepSpeedStrategy.setup(). Run training through the Trainer, or call strategy.setup(trainer) first."
            )
            raise MisconfigurationError(msg)
        return self._engine

    def backward(
        self,
        tensor: torch.Tensor,
        model: nn.Module | None,
        optimizer: Optimizer | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """``engine.backward``: it scales the loss (fp16, 1/accumulation) and reduces gradients."""
        self._require_engine().backward(tensor, *args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        """Run the closure, the Trainer's pre-step slot, then ``engine.step``.

        ``engine.step`` only updates at an accumulation boundary; it also clips (config
        ``gradient_clipping``), skips fp16 overflow steps and zeroes gradients.

        Raises:
            MisconfigurationError: LBFGS (the engine cannot re-evaluate a closure).
        """
        if isinstance(optimizer, LBFGS):
            msg = "DeepSpeed cannot step torch.optim.LBFGS (it re-evaluates the closure). Fix: use another optimizer or strategy='ddp'."
            raise MisconfigurationError(msg)
        result = closure()
        self.before_optimizer_step(optimizer)
        self._require_engine().step(**kwargs)
        return result

    def clip_gradients(self, optimizer: Optimizer, clip_val: float | None = None, gradient_clip_algorithm: str = "norm") -> None:
        """No-op: the engine clips (``gradient_clipping`` in its config, set from the Trainer)."""

    def teardown(self) -> None:
        """Forget the engine so that it can be garbage-collected with its buffers."""
        self._engine = None
