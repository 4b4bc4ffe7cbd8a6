"""The context-parallel part of ModelParallelStrategy's steps, kept apart from the mesh logic.

A mixin in front of ``ParallelStrategy``: its ``super()`` calls reach the core's plain step and
backward, so the batch split and the attention mode wrap exactly the Module's step.
"""

from __future__ import annotations

from typing import Any

import torch

from phalanx.errors import MisconfigurationError
from phalanx_strategy_model_parallel._context_parallel import (
    ContextParallelAttention,
    context_parallel_positions,
    split_batch,
)
from phalanx_strategy_model_parallel._layout import CONTEXT_PARALLEL

__all__ = ["ContextParallelSteps"]


class ContextParallelSteps:
    """Training step and backward under context parallel; a no-op layer when ``context_parallel_size == 1``."""

    _cp_checked: bool
    #: The mesh, and its context-parallel group and this rank's place in it (see _context_parallel_mode).
    _cp_group: tuple[Any, Any, int] | None = None
    _module: Any
    _device_mesh: Any
    context_parallel_seq_dims: Any
    layout: Any
    device_mesh: Any

    def context_parallel_positions(self, local_seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
        """This rank's global token positions inside a training step; see :func:`context_parallel_positions`."""
        return context_parallel_positions(local_seq_len, device)

    def _context_parallel_mode(self) -> ContextParallelAttention:
        mesh = self.device_mesh
        if self._cp_group is None or self._cp_group[0] is not mesh:
            # once per mesh: slicing a DeviceMesh builds a new sub-mesh each time (about 800 Python
            # calls in torch 2.13), and a step enters this mode twice (step, backward)
            cp_mesh = mesh[CONTEXT_PARALLEL]
            self._cp_group = (mesh, cp_mesh.get_group(), cp_mesh.get_local_rank())
        _, group, rank = self._cp_group
        return ContextParallelAttention(group, self.layout.context_parallel, rank)

    def _context_parallel_step(self, *args: Any, **kwargs: Any) -> Any:
        """Split the batch's sequences, run the step with whole-sequence attention, check SDPA ran."""
        mode = self._context_parallel_mode()
        if args:
            args = (split_batch(args[0], self.context_parallel_seq_dims, mode.size, mode.rank), *args[1:])
        else:
            kwargs["batch"] = split_batch(kwargs["batch"], self.context_parallel_seq_dims, mode.size, mode.rank)
        with mode:
            output = super().training_step(*args, **kwargs)  # type: ignore[misc]
        if not self._cp_checked:
            if mode.calls == 0:
                msg = (
                    f"context_parallel_size={mode.size}: the first training step of {type(self.module).__qualname__} "
                    "called no F.scaled_dot_product_attention, so every rank saw only its part of each sequence "
                    "and nothing attended across ranks. Fix: compute attention with "
                    "torch.nn.functional.scaled_dot_product_attention (hand-written softmax attention cannot be "
                    "split), or set context_parallel_size=1."
                )
                raise MisconfigurationError(msg)
            self._cp_checked = True
        return output

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Under context parallel, backward too: recomputed (checkpointed) attention must gather K/V again."""
        if self.layout.context_parallel == 1 or self._device_mesh is None:
            return super().backward(closure_loss, optimizer, *args, **kwargs)  # type: ignore[misc]
        with self._context_parallel_mode():
            return super().backward(closure_loss, optimizer, *args, **kwargs)  # type: ignore[misc]
