"""Running a ``torch.distributed.pipelining`` schedule for one batch, inside the Trainer's step.

The schedule runs forward *and* backward of every microbatch itself (1F1B interleaves them), so
under pipeline parallel the Module's ``training_step`` calls ``strategy.run_pipeline(inputs,
target=..., loss_fn=...)``: it splits the batch into microbatches, runs the schedule, and returns
the mean of the per-microbatch losses on every pipeline rank (a detached tensor: backward has
already happened). With a mean-reduced ``loss_fn`` and equal microbatches that is the full batch's
loss, and the gradients are those of the full batch (the schedule divides them by the number of
microbatches).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from phalanx.errors import MisconfigurationError

__all__ = ["SCHEDULES", "PipelineRunner", "stage_indices"]

#: name -> (schedule class, whether it runs several stages per rank)
SCHEDULES: dict[str, tuple[type, bool]] = {
    "gpipe": (ScheduleGPipe, False),
    "1f1b": (Schedule1F1B, False),
    "interleaved_1f1b": (ScheduleInterleaved1F1B, True),
}


def stage_indices(pp_rank: int, pp_size: int, stages_per_rank: int) -> list[int]:
    """The stages a pipeline rank runs: ``pp_rank``, ``pp_rank + pp``, ... (the looped layout)."""
    return [pp_rank + k * pp_size for k in range(stages_per_rank)]


@dataclass
class _Call:
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    scale: float


class PipelineRunner:
    """One schedule over this rank's stages; rebuilt per run (train or eval) of the Trainer."""

    def __init__(
        self,
        modules: list[nn.Module],
        indices: list[int],
        *,
        num_stages: int,
        device: torch.device,
        group: dist.ProcessGroup,
        schedule: str,
        num_microbatches: int,
    ) -> None:
        self.stages = [
            PipelineStage(module, index, num_stages, device, group=group) for module, index in zip(modules, indices)
        ]
        self.num_stages = num_stages
        self.num_microbatches = num_microbatches
        self.group = group
        self.is_first = 0 in indices
        self.is_last = num_stages - 1 in indices
        self._last_rank = dist.get_global_rank(group, dist.get_world_size(group) - 1)
        self._device = device
        self._call = _Call(None, 1.0)
        cls, multi = SCHEDULES[schedule]
        target = self.stages if multi else self.stages[0]
        self._with_loss = cls(target, num_microbatches, loss_fn=self._loss)
        self._without_loss = cls(target, num_microbatches, loss_fn=None)

    def _loss(self, output: Any, target: Any) -> torch.Tensor:
        assert self._call.loss_fn is not None
        loss = self._call.loss_fn(output, target)
        return loss * self._call.scale if self._call.scale != 1.0 else loss

    def _check_batch(self, inputs: tuple[Any, ...], target: Any) -> None:
        for value in (*inputs, target):
            if isinstance(value, torch.Tensor) and value.shape[0] % self.num_microbatches:
                msg = (
                    f"run_pipeline got a batch of {value.shape[0]} samples, which does not split into "
                    f"num_microbatches={self.num_microbatches} equal microbatches. Fix: make the per-rank batch size a "
                    "multiple of num_microbatches (DataLoader(batch_size=...), drop_last=True), or change num_microbatches."
                )
                raise MisconfigurationError(msg)

    def run(
        self,
        inputs: tuple[Any, ...],
        *,
        target: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None,
        scale: float = 1.0,
    ) -> Any:
        """Run the batch; returns the mean microbatch loss (with ``loss_fn``) or the outputs, on every rank."""
        if loss_fn is not None and target is None:
            msg = "run_pipeline(loss_fn=...) needs target=...: the loss of the last stage compares its output with it."
            raise MisconfigurationError(msg)
        self._check_batch(inputs, target)
        self._call = _Call(loss_fn, scale)
        schedule = self._with_loss if loss_fn is not None else self._without_loss
        args = inputs if self.is_first else ()
        kwargs: dict[str, Any] = {}
        losses: list[torch.Tensor] = []
        if loss_fn is not None and self.is_last:
            kwargs = {"target": target, "losses": losses}
        if torch.is_grad_enabled() and loss_fn is not None:
            output = schedule.step(*args, **kwargs)
        else:
            with torch.no_grad():
                output = schedule.eval(*args, **kwargs)
        if loss_fn is None:
            return self._share_outputs(output)
        mean = torch.stack([loss.detach().float() for loss in losses]).mean() / scale if self.is_last else None
        return self._share_loss(mean)

    def _share_loss(self, mean: torch.Tensor | None) -> torch.Tensor:
        value = mean if mean is not None else torch.zeros((), dtype=torch.float32, device=self._device)
        value = value.to(self._device).contiguous()
        dist.broadcast(value, src=self._last_rank, group=self.group)
        return value

    def _share_outputs(self, output: Any) -> Any:
        box = [output.detach().cpu() if isinstance(output, torch.Tensor) else output]
        dist.broadcast_object_list(box, src=self._last_rank, group=self.group)
        result = box[0]
        return result.to(self._device) if isinstance(result, torch.Tensor) else result
