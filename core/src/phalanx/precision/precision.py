"""The Precision base class, which is also the default ``"32-true"`` precision.

A precision owns everything about numeric formats: how the module and inputs are cast, the
autocast region around forward, how the loss is backpropagated (loss scaling) and how the
optimizer steps (unscaling, skipping steps with inf gradients). Strategies never touch dtypes
themselves; they call these hooks, so any strategy works with any precision.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim import Optimizer

from phalanx.errors import MisconfigurationError

__all__ = ["Precision"]

_CLIP_ALGORITHMS = ("norm", "value")


def _optimizer_params(optimizer: Optimizer) -> list[torch.Tensor]:
    return [param for group in optimizer.param_groups for param in group["params"]]


class Precision:
    """Full 32-bit precision; the base every other precision overrides.

    Every hook here is a pass-through, so ``Precision()`` trains exactly like plain PyTorch. Inputs
    are left untouched (as in Lightning): the data is assumed to already be float32, and silently
    down-casting a user's float64 data would hide a real mismatch.
    """

    #: Canonical precision name, as accepted by ``Trainer(precision=...)``.
    precision: str = "32-true"
    #: Whether this precision's step methods (backward, optimizer_step, the step contexts) only pass
    #: the step through, so the Trainer may call ``optimizer.step(closure)`` directly (docs/trainer.md,
    #: "the step pipeline"). Never inherited: a subclass takes the layered step unless its own class
    #: body sets it True.
    passes_step_through: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "passes_step_through" not in cls.__dict__:
            cls.passes_step_through = False

    def setup(self, device: torch.device) -> None:
        """Learn the device the strategy will run on (autocast needs its type). No-op here."""

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast the module's parameters and buffers to this precision; unchanged here."""
        return module

    def convert_input(self, data: Any) -> Any:
        """Cast the floating-point tensors of a batch to this precision; unchanged here."""
        return data

    def tensor_init_context(self) -> AbstractContextManager[None]:
        """Context in which new tensors are created with this precision's dtype."""
        return nullcontext()

    def module_init_context(self) -> AbstractContextManager[None]:
        """Context in which a module is instantiated; defaults to :meth:`tensor_init_context`."""
        return self.tensor_init_context()

    def forward_context(self) -> AbstractContextManager[Any]:
        """Context around every forward pass (autocast for mixed precision)."""
        return nullcontext()

    def train_step_context(self) -> AbstractContextManager[Any]:
        """Context around ``training_step``; the forward context unless a precision needs more."""
        return self.forward_context()

    def val_step_context(self) -> AbstractContextManager[Any]:
        """Context around ``validation_step``."""
        return self.forward_context()

    def test_step_context(self) -> AbstractContextManager[Any]:
        """Context around ``test_step``."""
        return self.forward_context()

    def predict_step_context(self) -> AbstractContextManager[Any]:
        """Context around ``predict_step``."""
        return self.forward_context()

    def connect(self, model: nn.Module, optimizers: list[Optimizer]) -> tuple[nn.Module, list[Optimizer]]:
        """Let the precision wrap the model or optimizers (e.g. a library's own AMP); identity here."""
        return model, optimizers

    def pre_backward(self, tensor: torch.Tensor, module: nn.Module | None) -> torch.Tensor:
        """Runs before backward; returns the loss to backpropagate."""
        return tensor

    @property
    def scaler(self) -> Any:
        """The loss scaler (a ``torch.amp.GradScaler``) of precisions that scale the loss; None here."""
        return None

    def backward(
        self,
        tensor: torch.Tensor,
        model: nn.Module | None,
        optimizer: Optimizer | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Backpropagate ``tensor`` through the Module's ``backward`` hook (``Tensor.backward`` by
        default; a Module overrides it to enter e.g. ``loss_parallel()``); ``args``/``kwargs`` go along.
        A model without the hook (a plain ``nn.Module``) calls ``Tensor.backward`` directly."""
        hook = getattr(model, "backward", None)  # nn.Module has no ``backward``: only a phalanx Module does
        if hook is not None:
            hook(tensor, *args, **kwargs)
        else:
            tensor.backward(*args, **kwargs)

    def post_backward(self, tensor: torch.Tensor, module: nn.Module | None) -> torch.Tensor:
        """Runs after backward; returns the (unscaled) loss."""
        return tensor

    #: The Trainer's work between gradients being ready and the optimizer step, handed over by
    #: :meth:`connect_before_optimizer_step` for a stage; None outside one (manual use).
    _before_optimizer_step: Callable[[Optimizer], None] | None = None

    def connect_before_optimizer_step(self, before_optimizer_step: Callable[[Optimizer], None] | None) -> None:
        """The Trainer hands over its slot between backward and the optimizer step for a stage.

        Called with the stage's ``Run.before_optimizer_step`` (``on_before_optimizer_step`` and
        gradient clipping: only the Trainer knows the callbacks and the clipping settings) when the
        stage starts, and with None when it ends. The precision calls it once gradients are at their
        true scale (:meth:`before_optimizer_step`), so both see unscaled gradients under AMP.
        """
        self._before_optimizer_step = before_optimizer_step

    def before_optimizer_step(self, optimizer: Optimizer) -> None:
        """Give the Trainer its slot between gradients being ready and the optimizer stepping (the
        function :meth:`connect_before_optimizer_step` handed over; nothing outside a stage).

        A precision that runs the closure itself (rather than through :meth:`optimizer_step`'s
        wrapped closure) calls this once the gradients are at their true scale.
        """
        if self._before_optimizer_step is not None:
            self._before_optimizer_step(optimizer)

    def _after_closure(self, model: Any, optimizer: Optimizer) -> None:
        """Lightning's name of the slot (its precisions call ``self._after_closure(model, optimizer)``)."""
        self.before_optimizer_step(optimizer)

    def _wrap_closure(self, model: Any, optimizer: Optimizer, closure: Callable[[], Any]) -> Any:
        closure_result = closure()
        self.before_optimizer_step(optimizer)
        return closure_result

    def optimizer_step(
        self,
        optimizer: Optimizer,
        model: Any,
        closure: Callable[[], Any],
        **kwargs: Any,
    ) -> Any:
        """Run the closure (forward + backward), the Trainer's pre-step work, then the step.

        The closure is handed to ``optimizer.step`` wrapped, so optimizers that evaluate it several
        times (LBFGS) work, and clipping sees each evaluation's gradients.

        Returns:
            What ``optimizer.step`` returns: for torch's optimizers, the closure's result.
        """
        return optimizer.step(closure=partial(self._wrap_closure, model, optimizer, closure), **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Bring gradients back to their true scale before they are inspected; no-op without scaling."""

    def clip_gradients(
        self,
        optimizer: Optimizer,
        clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
    ) -> None:
        """Clip the gradients of every parameter ``optimizer`` updates.

        Args:
            optimizer: Whose parameters' gradients are clipped.
            clip_val: The maximum norm (``"norm"``) or absolute value (``"value"``); ``None`` or a
                value <= 0 disables clipping, matching ``Trainer(gradient_clip_val=None)``.
            gradient_clip_algorithm: ``"norm"`` (``clip_grad_norm_``) or ``"value"``
                (``clip_grad_value_``).

        Raises:
            MisconfigurationError: Unknown algorithm.
        """
        algorithm = str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)).lower()
        if algorithm not in _CLIP_ALGORITHMS:
            msg = (
                f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not supported; valid values "
                f"are {list(_CLIP_ALGORITHMS)}. Pass gradient_clip_algorithm='norm' or 'value'."
            )
            raise MisconfigurationError(msg)
        if clip_val is None or clip_val <= 0:
            return
        params = _optimizer_params(optimizer)
        if algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(params, clip_val)
        else:
            torch.nn.utils.clip_grad_value_(params, clip_val)

    def state_dict(self) -> dict[str, Any]:
        """State to store in checkpoints (a loss scaler's); empty here."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def teardown(self) -> None:
        """Release resources at the end of a run."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(precision={self.precision!r})"
