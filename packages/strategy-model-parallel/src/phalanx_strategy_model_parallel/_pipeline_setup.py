"""The strategy's pipeline state: this rank's stages, the schedule, and the step's gradients.

Three things tie the pipelining schedule into the Trainer's step:

* the stages are split out of the Module once (:meth:`PipelineSetup.split`: the Module's blocks
  grouped into as many stages as the schedule runs, this rank's placed by the schedule's layout),
  and with data parallel each stage is sharded over ``data_parallel`` (``fully_shard``) unless the
  Module did so;
* the schedule runs forward and backward inside ``training_step``; gradient accumulation is
  honoured by zeroing at the start of a window and scaling the loss by 1/accumulate_grad_batches;
* the strategy says so (``training_step_runs_backward``), so the Trainer zeroes gradients *before*
  ``training_step`` and does not backpropagate the returned loss again (the core's step pipeline,
  docs/trainer.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from phalanx.errors import MisconfigurationError
from phalanx_strategy_model_parallel._layout import DATA_PARALLEL, PIPELINE_PARALLEL
from phalanx_strategy_model_parallel._pipeline import (
    SCHEDULES,
    PipelineRunner,
    check_microbatches,
    stage_indices,
    stages_per_rank,
)
from phalanx_strategy_model_parallel._stages import declared_blocks, group_blocks, keep_only

__all__ = ["PipelineSetup"]


class PipelineSetup:
    """This rank's stages and schedule; created by the strategy's ``wrap_model``."""

    def __init__(
        self, strategy: Any, module: nn.Module, stages: list[nn.Module], indices: list[int], num_stages: int
    ) -> None:
        self.strategy = strategy
        self.module = module
        self.stages = stages
        self.indices = indices
        self.num_stages = num_stages
        self.dropped: list[str] = []
        self.runner: PipelineRunner | None = None
        self._in_step = False
        self._zero = False
        self._scale = 1.0
        self._ran = False  # run() happened in this training step

    @classmethod
    def split(cls, strategy: Any, module: nn.Module) -> PipelineSetup:
        """Group the declared blocks into stages, keep this rank's, shard them over data parallel when needed.

        Raises:
            MisconfigurationError: Too few blocks for the schedule's stages, or a microbatch count
                the schedule does not run.
        """
        layout = strategy.layout
        schedule = strategy.pipeline_schedule
        pp = layout.pipeline_parallel
        blocks = declared_blocks(module)
        per_rank = stages_per_rank(schedule, len(blocks), pp)
        num_stages = pp * per_rank
        stages = group_blocks(
            blocks,
            num_stages,
            name=type(module).__qualname__,
            schedule=schedule,
            pipeline_size=pp,
            layout=SCHEDULES[schedule].layout,
        )
        check_microbatches(
            schedule, strategy.num_microbatches or 2 * num_stages, pipeline_size=pp, num_stages=num_stages
        )
        pp_rank = layout.coordinates(strategy.global_rank)[PIPELINE_PARALLEL]
        indices = stage_indices(schedule, pp_rank, pp, per_rank)
        mine = [stages[i] for i in indices]
        setup = cls(strategy, module, mine, indices, num_stages)
        setup.dropped = keep_only(module, mine)
        if layout.data_parallel > 1:
            mesh = strategy.device_mesh[DATA_PARALLEL]
            for stage in mine:
                if not any(isinstance(m, FSDPModule) for m in stage.modules()):
                    fully_shard(stage, mesh=mesh)
        return setup

    def build(self, *, training: bool) -> None:
        """A fresh schedule for this run (stages re-infer shapes: eval batches may differ)."""
        del training
        strategy = self.strategy
        micro = strategy.num_microbatches or 2 * self.num_stages
        self.runner = PipelineRunner(
            self.stages,
            self.indices,
            num_stages=self.num_stages,
            device=strategy.root_device,
            group=strategy.device_mesh[PIPELINE_PARALLEL].get_group(),
            schedule=strategy.pipeline_schedule,
            num_microbatches=micro,
        )

    # ------------------------------------------------------------------ training step
    def begin_step(self, batch_idx: int, trainer: Any) -> None:
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        self._in_step = True
        self._zero = batch_idx % accumulate == 0
        self._scale = 1.0 / accumulate
        self._ran = False

    def end_step(self, output: Any) -> None:
        """Check that a training step which returned a loss ran the pipeline (which did backward).

        Raises:
            MisconfigurationError: ``training_step`` returned a loss without running the pipeline.
        """
        self._in_step = False
        if output is not None and not self._ran:
            msg = (
                "Under pipeline_parallel_size > 1, training_step must run the model through "
                "self.trainer.strategy.run_pipeline(inputs, target=..., loss_fn=...) and return its loss; the schedule "
                "does backward itself. Fix: replace the direct forward in training_step with run_pipeline."
            )
            raise MisconfigurationError(msg)

    def run(self, inputs: tuple[Any, ...], *, target: Any, loss_fn: Callable[[Any, Any], torch.Tensor] | None) -> Any:
        runner = self.runner
        assert runner is not None, "wrap_model builds the schedule before any step"
        training = self._in_step and torch.is_grad_enabled() and loss_fn is not None
        if not training:
            return runner.run(inputs, target=target, loss_fn=loss_fn)
        if self._ran:
            msg = "training_step called run_pipeline twice for one batch; call it once per training_step."
            raise MisconfigurationError(msg)
        params = list(self.module.parameters())
        if self._zero:
            for param in params:
                param.grad = None
        loss = runner.run(inputs, target=target, loss_fn=loss_fn, scale=self._scale)
        self._ran = True
        return loss
