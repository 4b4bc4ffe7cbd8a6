"""``"16-mixed"`` and ``"bf16-mixed"``: automatic mixed precision with ``torch.autocast``.

Weights stay float32; eligible ops inside forward run in 16 bits. That keeps accurate updates while
getting most of the speed and activation-memory savings. float16 has a narrow range, so
``"16-mixed"`` scales the loss with a ``GradScaler`` (gradients would otherwise underflow) and skips
steps whose gradients overflowed; bfloat16 has float32's range and needs no scaler.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision

__all__ = ["MixedPrecision"]

_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


def _handles_unscaling(optimizer: Optimizer) -> bool:
    """Fused optimizers unscale inside ``step``; calling ``unscale_`` on them is wrong."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def _default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class MixedPrecision(Precision):
    """Autocast forward passes; scale the loss for float16.

    Args:
        precision: ``"16-mixed"`` or ``"bf16-mixed"``.
        device: Device type to autocast on (``"cpu"``, ``"cuda"``, ...). ``None`` takes it from
            the strategy's root device at :meth:`setup`; the strategy's device always wins there,
            because autocasting on a device the model is not on would silently do nothing.
        scaler: A ``torch.amp.GradScaler`` to use with ``"16-mixed"`` (e.g. with a custom initial
            scale). ``None`` creates a default one. Not allowed with ``"bf16-mixed"``.

    Raises:
        MisconfigurationError: Unknown precision, or a scaler given for bf16.
    """

    def __init__(
        self,
        precision: str = "16-mixed",
        *,
        device: str | None = None,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        if precision not in _DTYPES:
            msg = (
                f"MixedPrecision(precision={precision!r}) is not supported; valid values are "
                f"{list(_DTYPES)}. For pure 16-bit training use HalfPrecision('16-true'/'bf16-true')."
            )
            raise MisconfigurationError(msg)
        if scaler is not None and precision == "bf16-mixed":
            msg = (
                "MixedPrecision('bf16-mixed') got a GradScaler, but bfloat16 does not need loss "
                "scaling; drop scaler=..., or use precision='16-mixed'."
            )
            raise MisconfigurationError(msg)
        self.precision = precision
        self.device = device
        self._dtype = _DTYPES[precision]
        self._scaler = scaler
        self._owns_scaler = scaler is None
        self._scaler_device: str | None = None
        self._pending_state: dict[str, Any] | None = None
        self._unscaled: set[int] = set()
        if device is not None:
            self._ensure_scaler()

    @property
    def dtype(self) -> torch.dtype:
        """The dtype autocast computes eligible ops in."""
        return self._dtype

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler (``"16-mixed"`` only); created on first need when no device was given."""
        return self._ensure_scaler()

    def _device_type(self) -> str:
        return self.device if self.device is not None else _default_device_type()

    def _ensure_scaler(self) -> torch.amp.GradScaler | None:
        if self.precision != "16-mixed":
            return None
        device = self._device_type()
        if self._scaler is not None and (not self._owns_scaler or self._scaler_device == device):
            return self._scaler
        # First use, or the strategy's device differs from the one the default scaler was built
        # for: (re)build it, carrying over any state already loaded from a checkpoint.
        previous_state = self._scaler.state_dict() if self._scaler is not None else None
        self._scaler = torch.amp.GradScaler(device)
        self._scaler_device = device
        state = self._pending_state if self._pending_state is not None else previous_state
        if state:
            self._scaler.load_state_dict(state)
        self._pending_state = None
        return self._scaler

    def setup(self, device: torch.device) -> None:
        """Autocast on the strategy's device type and build the scaler for it."""
        self.device = device.type
        self._ensure_scaler()

    def forward_context(self) -> AbstractContextManager[Any]:
        """Autocast region in which eligible ops run in float16/bfloat16."""
        return torch.autocast(self._device_type(), dtype=self._dtype)

    def backward(
        self,
        tensor: torch.Tensor,
        model: nn.Module | None,
        optimizer: Optimizer | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Backpropagate the scaled loss so small float16 gradients do not flush to zero."""
        scaler = self.scaler
        if scaler is not None:
            tensor = scaler.scale(tensor)
        super().backward(tensor, model, optimizer, *args, **kwargs)

    def optimizer_step(
        self,
        optimizer: Optimizer,
        model: Any,
        closure: Callable[[], Any],
        **kwargs: Any,
    ) -> Any:
        """Closure, unscale, Trainer pre-step work (clipping sees true gradients), scaled step.

        ``scaler.step`` skips the update when a gradient is inf/NaN and ``scaler.update`` then
        lowers the scale, so an overflow costs one step instead of corrupting the weights.

        Returns:
            The closure's result (``None`` when the closure skipped backward; no step is taken then).

        Raises:
            MisconfigurationError: LBFGS, which must re-evaluate the closure and cannot be scaled.
        """
        scaler = self.scaler
        if scaler is None:
            return super().optimizer_step(optimizer, model, closure, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            msg = (
                "precision='16-mixed' cannot drive torch.optim.LBFGS (it re-evaluates the closure, "
                "which a GradScaler cannot scale); use precision='32-true' or 'bf16-mixed' with LBFGS."
            )
            raise MisconfigurationError(msg)
        closure_result = closure()
        skipped_backward = closure_result is None and getattr(model, "automatic_optimization", True)
        if skipped_backward:
            return None
        self.unscale_gradients(optimizer)
        self.before_optimizer_step(optimizer)
        scaler.step(optimizer, **kwargs)
        scaler.update()
        self._unscaled.clear()
        return closure_result

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Divide gradients by the loss scale; safe to call more than once per step."""
        scaler = self.scaler
        if scaler is None or _handles_unscaling(optimizer) or id(optimizer) in self._unscaled:
            return
        scaler.unscale_(optimizer)
        self._unscaled.add(id(optimizer))

    def clip_gradients(
        self,
        optimizer: Optimizer,
        clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
    ) -> None:
        """Clip true-scale gradients.

        Raises:
            MisconfigurationError: Clipping requested with a fused optimizer, whose gradients stay
                scaled until its own ``step``.
        """
        clipping = clip_val is not None and clip_val > 0
        if clipping and self.scaler is not None and _handles_unscaling(optimizer):
            msg = (
                f"Gradient clipping (clip_val={clip_val!r}) is not possible with the fused optimizer "
                f"{type(optimizer).__name__} under precision='16-mixed': its gradients stay scaled "
                "until step(). Create the optimizer with fused=False, or disable clipping."
            )
            raise MisconfigurationError(msg)
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (current scale and growth tracker); empty for bf16."""
        scaler = self.scaler
        return scaler.state_dict() if scaler is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the scaler; kept until the scaler exists when loaded before setup."""
        if self.precision != "16-mixed" or not state_dict:
            return
        if self.device is None and self._scaler is None:
            self._pending_state = dict(state_dict)
            return
        scaler = self._ensure_scaler()
        if scaler is not None:
            scaler.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"MixedPrecision(precision={self.precision!r}, device={self.device!r})"
