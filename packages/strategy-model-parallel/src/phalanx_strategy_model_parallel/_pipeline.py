"""Running a ``torch.distributed.pipelining`` schedule for one batch, inside the Trainer's step.

The schedule runs forward *and* backward of every microbatch itself (1F1B interleaves them), so
under pipeline parallel the Module's ``training_step`` calls ``strategy.run_pipeline(inputs,
target=..., loss_fn=...)``: it splits the batch into microbatches, runs the schedule, and returns
the mean of the per-microbatch losses on every pipeline rank (a detached tensor: backward has
already happened). With a mean-reduced ``loss_fn`` and equal microbatches that is the full batch's
loss, and the gradients are those of the full batch: each microbatch's loss is divided by the
number of microbatches before its backward (the schedules are built with ``scale_grads=False``,
so nothing divides the accumulated gradients afterwards; gradients of earlier batches of an
accumulation window stay as they were).

The schedules (:data:`SCHEDULES`) differ in how many stages a rank runs and where they sit:

* ``"single"``: one stage per rank, rank ``r`` runs stage ``r`` (GPipe, 1F1B);
* ``"loop"``: ``k >= 2`` stages per rank, rank ``r`` runs ``r, r + pp, r + 2 pp, ...``
  (Interleaved 1F1B, Looped BFS, Interleaved Zero Bubble);
* ``"v"``: exactly two stages per rank, rank ``r`` runs ``r`` and ``2 pp - 1 - r`` (ZB-V,
  DualPipeV): rank 0 holds the first and the last stage, so the loss is computed there.

The zero-bubble schedules split each backward into the inputs' gradient (sent upstream at once)
and the weights' gradient (run later, in what would be a bubble); torch's ``PipelineStage`` does
the split on the stage's autograd graph.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

from phalanx.errors import MisconfigurationError

__all__ = [
    "SCHEDULES",
    "PipelineRunner",
    "ScheduleSpec",
    "check_microbatches",
    "check_schedule_name",
    "last_stage_rank",
    "stage_indices",
    "stages_per_rank",
]


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule: its torch class, its stage layout and whether it splits backward (zero bubble).

    Attributes:
        torch_class: The ``torch.distributed.pipelining`` schedule class.
        layout: ``"single"`` (one stage per rank), ``"loop"`` (rank ``r`` runs ``r, r + pp, ...``)
            or ``"v"`` (rank ``r`` runs ``r`` and ``2 pp - 1 - r``).
        split_backward: Whether it computes input and weight gradients separately.
    """

    torch_class: type
    layout: Literal["single", "loop", "v"]
    split_backward: bool = False


#: name -> what runs; the names are torch's class names in snake case, without "Schedule".
SCHEDULES: dict[str, ScheduleSpec] = {
    "gpipe": ScheduleSpec(ScheduleGPipe, "single"),
    "1f1b": ScheduleSpec(Schedule1F1B, "single"),
    "interleaved_1f1b": ScheduleSpec(ScheduleInterleaved1F1B, "loop"),
    "looped_bfs": ScheduleSpec(ScheduleLoopedBFS, "loop"),
    "interleaved_zero_bubble": ScheduleSpec(ScheduleInterleavedZeroBubble, "loop", split_backward=True),
    "zbv_zero_bubble": ScheduleSpec(ScheduleZBVZeroBubble, "v", split_backward=True),
    "dualpipe_v": ScheduleSpec(ScheduleDualPipeV, "v", split_backward=True),
}


def _normalized(name: str) -> str:
    return name.lower().removeprefix("schedule").replace("_", "").replace("-", "")


def check_schedule_name(name: object) -> str:
    """The schedule's name, checked; torch's class names (``"ScheduleZBVZeroBubble"``) are pointed to ours.

    Raises:
        MisconfigurationError: An unknown name, with the closest valid one and every choice.
    """
    if isinstance(name, str) and name in SCHEDULES:
        return name
    text = str(name)
    by_normalized = {_normalized(key): key for key in SCHEDULES}
    torch_names = {_normalized(spec.torch_class.__name__): key for key, spec in SCHEDULES.items()}
    key = _normalized(text)
    closest = by_normalized.get(key) or torch_names.get(key)
    if closest is None and key:
        containing = [k for k in by_normalized if key in k or k in key]  # "zbv" -> "zbvzerobubble"
        matches = difflib.get_close_matches(key, containing or list(by_normalized), n=1, cutoff=0 if containing else 0.5)
        closest = by_normalized[matches[0]] if matches else None
    hint = f" Did you mean {closest!r}?" if closest else ""
    msg = (
        f"ModelParallelStrategy(pipeline_schedule={name!r}) is unknown.{hint} Fix: choose one of {list(SCHEDULES)} "
        "(torch.distributed.pipelining's schedules; docs/model-parallel.md, 'Pipeline stages', says which to pick)."
    )
    raise MisconfigurationError(msg)


def stages_per_rank(schedule: str, num_blocks: int, pipeline_size: int) -> int:
    """How many stages each rank runs: 1 (single), 2 (V), or as many as the blocks allow, at least 2 (loop)."""
    layout = SCHEDULES[schedule].layout
    if layout == "single":
        return 1
    if layout == "v":
        return 2
    return max(2, num_blocks // pipeline_size)


def stage_indices(schedule: str, pp_rank: int, pp_size: int, per_rank: int) -> list[int]:
    """The stages a pipeline rank runs, in increasing order, for the schedule's layout."""
    layout = SCHEDULES[schedule].layout
    if layout == "v":
        return [pp_rank, 2 * pp_size - 1 - pp_rank]
    return [pp_rank + k * pp_size for k in range(per_rank)]


def last_stage_rank(schedule: str, pp_size: int) -> int:
    """The pipeline rank running the last stage (it computes the loss): 0 for V layouts, else the last rank."""
    return 0 if SCHEDULES[schedule].layout == "v" else pp_size - 1


def _accepts(schedule: str, n: int, pipeline_size: int, num_stages: int) -> bool:
    if schedule == "1f1b":
        return n >= pipeline_size
    if schedule == "dualpipe_v":
        return n >= num_stages
    if schedule in ("interleaved_1f1b", "interleaved_zero_bubble"):
        return n % max(1, n // pipeline_size) == 0
    return n >= 1


def check_microbatches(schedule: str, num_microbatches: int, *, pipeline_size: int, num_stages: int) -> None:
    """Refuse a microbatch count the schedule cannot run, naming the counts it takes.

    1F1B needs at least one microbatch per rank, DualPipeV at least one per stage, the interleaved
    schedules a count ``n`` divisible by their number of rounds ``max(1, n // pp)`` (every multiple
    of ``pp`` is); GPipe, Looped BFS and ZB-V take any count.

    Raises:
        MisconfigurationError: Naming the count, the rule, the nearest valid counts and the fix.
    """
    n = num_microbatches
    if _accepts(schedule, n, pipeline_size, num_stages):
        return
    rules = {
        "1f1b": f"at least pipeline_parallel_size={pipeline_size} microbatches (one per rank)",
        "dualpipe_v": f"at least as many microbatches as stages ({num_stages} = 2 x pipeline_parallel_size)",
    }
    rule = rules.get(
        schedule,
        f"a count n that its number of rounds, max(1, n // pipeline_parallel_size={pipeline_size}), divides (every "
        f"multiple of {pipeline_size} does)",
    )
    below = [c for c in range(n - 1, 0, -1) if _accepts(schedule, c, pipeline_size, num_stages)][:1]
    above = next(c for c in range(n + 1, n + 2 * num_stages + 2) if _accepts(schedule, c, pipeline_size, num_stages))
    msg = (
        f"num_microbatches={n} does not run with pipeline_schedule={schedule!r}: it needs {rule}. Fix: set "
        f"num_microbatches to one of {[*below, above]} (the per-rank batch size must be a multiple of it), leave it "
        f"unset (2 x the {num_stages} stages), or choose a schedule that takes any count ('gpipe', 'looped_bfs', "
        "'zbv_zero_bubble')."
    )
    raise MisconfigurationError(msg)


class _Stage(PipelineStage):
    """``PipelineStage`` that runs forward-only passes of the V layouts.

    Where a rank holds two adjacent stages (the middle of a V), torch's runtime hands gradients
    from one to the other directly, and does so for every backward action even in ``eval()``, where
    the stage refuses it (it has no backward). Without backward there is nothing to hand over.
    """

    def get_local_bwd_output(self, mb_index: int) -> tuple[torch.Tensor | None, ...]:
        return super().get_local_bwd_output(mb_index) if self.has_backward else ()

    def set_local_bwd_input(self, next_stage_bwd_outputs: tuple[torch.Tensor | None, ...], mb_index: int) -> None:
        if self.has_backward:
            super().set_local_bwd_input(next_stage_bwd_outputs, mb_index)


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
            _Stage(module, index, num_stages, device, group=group) for module, index in zip(modules, indices)
        ]
        self.num_stages = num_stages
        self.num_microbatches = num_microbatches
        self.group = group
        self.is_first = 0 in indices
        self.is_last = num_stages - 1 in indices
        self._last_rank = dist.get_global_rank(group, last_stage_rank(schedule, dist.get_world_size(group)))
        self._device = device
        self._call = _Call(None, 1.0)
        spec = SCHEDULES[schedule]
        target = self.stages if spec.layout != "single" else self.stages[0]
        # scale_grads=False: _loss divides each microbatch's loss instead, so that nothing divides
        # the gradients an accumulation window already holds.
        self._with_loss = spec.torch_class(target, num_microbatches, loss_fn=self._loss, scale_grads=False)
        self._without_loss = spec.torch_class(target, num_microbatches, loss_fn=None, scale_grads=False)

    def _loss(self, output: Any, target: Any) -> torch.Tensor:
        assert self._call.loss_fn is not None
        return self._call.loss_fn(output, target) * (self._call.scale / self.num_microbatches)

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
        losses: list[torch.Tensor] = []  # what _loss returned, per microbatch
        if loss_fn is not None and self.is_last:
            kwargs = {"target": target, "losses": losses}
        if torch.is_grad_enabled() and loss_fn is not None:
            output = schedule.step(*args, **kwargs)
        else:
            with torch.no_grad():
                output = schedule.eval(*args, **kwargs)
        if loss_fn is None:
            return self._share_outputs(output)
        undo = self.num_microbatches / scale
        mean = torch.stack([loss.detach().float() for loss in losses]).mean() * undo if self.is_last else None
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
