"""``lightning.pytorch.loops.utilities``: the loss check Lightning's loops expose."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["check_finite_loss"]


def check_finite_loss(loss: torch.Tensor | None) -> None:
    """Raise when ``loss`` holds NaN or infinity, so a diverged run stops at the step that diverged.

    Args:
        loss: The loss of a training step; ``None`` (a skipped batch) passes.

    Raises:
        ValueError: Some element of ``loss`` is not finite; the message shows the value.
    """
    import torch

    if loss is not None and not bool(torch.isfinite(loss).all()):
        msg = (
            f"The loss returned in `training_step` is {loss}: not finite. Lower the learning rate, clip "
            "gradients (Trainer(gradient_clip_val=...)) or look for a division by zero in training_step."
        )
        raise ValueError(msg)
