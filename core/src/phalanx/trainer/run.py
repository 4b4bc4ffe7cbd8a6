"""The Run: one stage's state in this process, which the loops receive.

``Trainer.fit`` & co. hold configuration; what a stage changes while it runs (the Module being
trained, its optimizers, which hook is running, whether to stop) lives here, in one object with
public fields. The loops, the step pipeline, checkpointing and preemption read and write the Run,
never the Trainer's fields; the Trainer's read-only properties (its TrainerView) read the Run.

Lifetime: ``run_stage`` (:mod:`phalanx.trainer.stage`) creates it when a stage starts in a rank and
the Trainer keeps it after the stage ends, so ``trainer.callback_metrics`` or
``trainer.optimizers`` still answer after ``fit`` returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx.trainer_view import RunningStage, TrainerFn, TrainerState

if TYPE_CHECKING:
    import torch

    from phalanx.module import Module
    from phalanx.strategies.strategy import Strategy
    from phalanx.trainer.config import TrainerConfig
    from phalanx.trainer.hook_runner import HookRunner
    from phalanx.trainer.metrics import MetricStore
    from phalanx.trainer_view import TrainerView

__all__ = ["Run"]


class Run:
    """One stage (fit, validate, test or predict) as it runs in this process.

    Args:
        trainer: The Trainer, as callbacks see it (hooks receive it).
        config: The Trainer's validated arguments (limits, intervals, clipping...).
        fn: The entry point being run.
        module: The Module.
        strategy: The configured Strategy.
        hooks: Calls callback and Module hooks; ``hooks.current`` is the hook running now.
        metrics: The metric store ``self.log`` writes to (the Trainer's, kept across stages).
        loops: The Trainer's fit, validation, test and predict loops (kept across stages: the fit
            loop's position is ``trainer.global_step`` after fit). Typed ``Any`` here because the
            loops and the step pipeline receive a Run: the Run imports none of them (no cycle).
        state: The Trainer's state record (entry point, loop, status).
        datamodule: The stage's DataModule, or None.
        profiler: The Trainer's :class:`~phalanx.profilers.Profiler`, or None.

    Attributes:
        optimizers: The optimizers as the strategy set them up.
        step_optimizers: The same, stepping through the strategy (what ``Module.optimizers()`` returns).
        should_stop: Set by callbacks (through ``trainer.should_stop``) or preemption: fit ends after this batch.
        has_validation: Whether this fit validates (data and a ``validation_step``).
    """

    def __init__(
        self,
        trainer: TrainerView,
        config: TrainerConfig,
        fn: TrainerFn,
        module: Module,
        strategy: Strategy,
        *,
        hooks: HookRunner,
        metrics: MetricStore,
        loops: tuple[Any, Any, Any, Any],
        state: TrainerState,
        datamodule: Any = None,
        profiler: Any = None,
    ) -> None:
        self.trainer = trainer
        self.config = config
        self.fn = fn
        self.module = module
        self.strategy = strategy
        self.hooks = hooks
        self.metrics = metrics
        self.fit_loop, self.val_loop, self.test_loop, self.predict_loop = loops
        self.state = state
        self.datamodule = datamodule
        #: The Trainer's profiler, or None (then nothing is timed and the loops skip the calls).
        self.profiler = profiler
        self.optimizers: list[torch.optim.Optimizer] = []
        self.step_optimizers: list[Any] = []  # StepOptimizer (trainer/step.py imports this module)
        self.should_stop = False
        self.has_validation = False
        #: The hang watchdog of a distributed stage (:mod:`phalanx.trainer.watchdog`), or None.
        self.watchdog: Any = None
        #: Whether fit got its training dataloader as an argument (else it came from a hook and can be reloaded).
        self.train_loader_given = False
        #: Whether ``training_step`` takes ``batch_idx`` (read from its signature when training starts).
        self.step_takes_batch_idx = True
        #: ``strategy.training_step_runs_backward``, read once when training starts (the step reads it per batch).
        self.training_step_runs_backward = False

    @property
    def lr_scheduler_configs(self) -> list[Any]:
        """The scheduler configurations, as the strategy holds them."""
        return list(self.strategy.lr_scheduler_configs)

    @property
    def stage(self) -> RunningStage | None:
        """The loop running now (validation runs inside fit)."""
        return self.state.stage

    @stage.setter
    def stage(self, stage: RunningStage | None) -> None:
        self.state.stage = stage

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The Trainer's slot between gradients being ready and the update: hooks, then clipping.

        The stage hands it to the precision (``Precision.connect_before_optimizer_step``), which
        calls it once gradients are at their true scale, so ``on_before_optimizer_step`` and
        clipping see unscaled gradients under AMP.
        """
        hooks = self.hooks
        if "on_before_optimizer_step" in hooks.live:
            hooks.call("on_before_optimizer_step", optimizer)
        config = self.config
        if config.gradient_clip_val or hooks.custom_clipping:
            hooks.current = "configure_gradient_clipping"
            self.module.configure_gradient_clipping(
                optimizer,
                gradient_clip_val=config.gradient_clip_val,
                gradient_clip_algorithm=config.gradient_clip_algorithm,
            )
        hooks.current = "training_step"

    def count_manual_step(self) -> None:
        """A manual ``optimizer.step()`` in training counts as an optimizer step (``global_step``)."""
        if self.fn is TrainerFn.FITTING:
            self.fit_loop.global_step += 1
