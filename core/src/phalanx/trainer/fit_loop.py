"""The fit loop: epochs, batches, accumulation, validation checks, schedulers, loop position.

The loop's position is explicit state (epoch, optimizer steps, batches done in the epoch, and which
post-batch work is done: ``phase``), so a checkpoint taken anywhere in fit (after a batch, during
validation, at epoch end) restores to exactly the next piece of work. Validation runs with the
training random streams saved and put back, so evaluating never changes what training computes.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from phalanx.errors import MisconfigurationError
from phalanx.strategies import Strategy
from phalanx.trainer._resume import Regrouped, needs_regroup, record_position, regroup_resumed_epoch
from phalanx.trainer.checkpointing import capture_rng, restore_rng
from phalanx.trainer.data import (
    generators_of,
    iterate_skipping,
    limit_batches,
    num_batches,
    prepare_loader,
    reload_train_loader,
    set_sampler_epoch,
    with_last,
)
from phalanx.trainer.preemption import Preemption
from phalanx.trainer.progress import BatchProgress
from phalanx.trainer.step import direct_step, run_automatic, run_direct, takes_batch_idx
from phalanx.trainer_view import RunningStage
from phalanx.utilities.model_helpers import is_overridden

if TYPE_CHECKING:
    from phalanx.trainer.config import TrainerConfig
    from phalanx.trainer.evaluation_loop import EvaluationLoop
    from phalanx.trainer.run import Run

__all__ = ["EpochLoop", "FitLoop"]

#: Work done for the last completed batch: its training ("train"), its validation check ("val"),
#: or the epoch-end hooks ("epoch_end", only the epoch schedulers remain).
PHASES = ("train", "val", "epoch_end")


class EpochLoop:
    """``trainer.fit_loop.epoch_loop`` (Lightning's name): what scripts read of the training epoch.

    Not a loop object of its own (phalanx's epoch is :meth:`FitLoop.run_epoch`): a read-only view of
    the fit loop's counts, and the evaluation loop that validates during fit.
    """

    def __init__(self, fit_loop: FitLoop, val_loop: EvaluationLoop | None) -> None:
        self._fit_loop = fit_loop
        self._val_loop = val_loop

    @property
    def val_loop(self) -> EvaluationLoop | None:
        """The loop that validates during fit; its ``batch_progress`` counts fit's validation batches."""
        return self._val_loop

    @property
    def batch_progress(self) -> BatchProgress:
        """Training batches: ``total`` across the fit's epochs, ``current`` in this epoch."""
        fit = self._fit_loop
        return BatchProgress.of(fit.total_batches_done, fit.batches_done, is_last_batch=fit.is_last_batch)

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (``trainer.global_step``)."""
        return self._fit_loop.global_step

    @property
    def total_batch_idx(self) -> int:
        """Index, across epochs, of the training batch running now or last run."""
        return self._fit_loop.total_batch_idx


class FitLoop:
    """Runs training epochs for :meth:`Trainer.fit`.

    The Trainer keeps one FitLoop for its lifetime: its position (``epoch``, ``global_step``) is
    ``trainer.current_epoch`` / ``trainer.global_step``, also after fit. Each fit hands it the
    stage's :class:`~phalanx.trainer.run.Run`.
    """

    def __init__(self, val_loop: EvaluationLoop | None = None) -> None:
        #: Lightning's ``fit_loop.epoch_loop``: read-only progress of the training epoch and the
        #: validation loop fit runs (``epoch_loop.val_loop.batch_progress.total.completed``).
        self.epoch_loop = EpochLoop(self, val_loop)
        self.epoch = 0
        self.global_step = 0
        self.batches_done = 0
        self.total_batches_done = 0
        #: Index, counted across epochs, of the training batch running now or last run (Lightning's
        #: ``fit_loop.total_batch_idx``; -1 before the first). Validation after batch k sees k - 1.
        self.total_batch_idx = -1
        #: ``time.monotonic()`` when fit's training started or the last validation ended (time-based
        #: ``val_check_interval`` measures from it).
        self.last_val_time = 0.0
        self.phase = "train"
        #: Whether the batch being trained is the last of its epoch.
        self.is_last_batch = False
        self.dataloader: Any = None
        self.num_batches: float = math.inf
        self.val_check_batch: float = math.inf
        self._generators: list[Any] = []
        self._epoch_start_rng: dict[str, Any] | None = None
        self._rng_before_val: dict[str, Any] | None = None
        self._resume: dict[str, Any] | None = None
        self._restarting = False
        #: The rest of a resumed epoch split over a new replica count (None: batches as sampled).
        self._regrouped: Regrouped | None = None
        self._last_logged_step = -1
        self._keep_train_metrics = False  # the first epoch of a fit keeps what on_train_start logged
        self._direct: Any = None  # the step run_direct calls this epoch, when it replaces the layered step
        self._direct_candidate: Any = None  # the same, decided once per fit, used in epochs without accumulation
        self._strategy_batch_hook = True
        #: Batches per optimizer step in the epoch running now: ``Trainer(accumulate_grad_batches)`` when
        #: fit starts; ``trainer.accumulate_grad_batches = n`` (GradientAccumulationScheduler) changes it.
        #: Read at each epoch start, so set it before or in ``on_train_epoch_start``.
        self.accumulate_grad_batches = 1
        self.preemption = Preemption()

    @property
    def uses_direct_step(self) -> bool:
        """Whether this fit takes the direct step (nothing in the step customised; see trainer/step.py)."""
        return self._direct is not None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The loop position (recorded in checkpoints under ``loops.fit``)."""
        state = {
            "epoch": self.epoch,
            "global_step": self.global_step,
            "batches_done": self.batches_done,
            "total_batches_done": self.total_batches_done,
            "phase": self.phase,
            "sampler_epoch": self.epoch,
            "num_batches": None if math.isinf(self.num_batches) else int(self.num_batches),
        }
        # the global sample position and replica count, which a resume on another world size needs;
        # absent when the data is not sharded by a DistributedSampler (nothing to translate)
        position = record_position(self.dataloader, self.batches_done, self._regrouped)
        if position is not None:
            state["data_position"] = position
        return state

    @property
    def restarting(self) -> bool:
        """Whether this fit resumed from a checkpoint and has not begun a fresh epoch yet (Lightning's name)."""
        return self._restarting

    @property
    def mid_accumulation(self) -> bool:
        """Whether gradients of an unfinished accumulation window are pending (they go into checkpoints)."""
        return (
            self.phase != "epoch_end"
            and 0 < self.batches_done < self.num_batches
            and self.batches_done % self.accumulate_grad_batches != 0
        )

    def rng_states(self) -> dict[str, Any]:
        """Random state now (the training state, also while validating) and at the epoch's start."""
        current = self._rng_before_val if self._rng_before_val is not None else capture_rng(self._generators)
        return {"current": current, "epoch_start": self._epoch_start_rng}

    def load_state_dict(self, state: dict[str, Any], rng: dict[str, Any] | None) -> None:
        """Restore a position; the random state is applied when the epoch resumes."""
        self.epoch = int(state["epoch"])
        self.global_step = int(state["global_step"])
        self.batches_done = int(state["batches_done"])
        self.total_batches_done = int(state.get("total_batches_done", 0))
        self.total_batch_idx = self.total_batches_done - 1
        self.phase = state.get("phase", "train")
        position = state.get("data_position")
        self._resume = {"batches_done": self.batches_done, "phase": self.phase, "rng": rng or {}, "position": position}
        self._restarting = True
        saved_batches = state.get("num_batches")
        if needs_regroup(position, self.dataloader):
            pass  # another replica count: the epoch's batch count differs by design, the rest is regrouped
        elif saved_batches is not None and not math.isinf(self.num_batches) and saved_batches != self.num_batches:
            warnings.warn(
                f"The checkpoint's epoch had {saved_batches} training batches, this run has {int(self.num_batches)}; "
                "the data changed, so the resumed run cannot match the original exactly.",
                stacklevel=2,
            )

    # ------------------------------------------------------------------ setup
    def setup(self, run: Run, loader: Any) -> None:
        """Prepare the training dataloader and the validation schedule.

        Raises:
            MisconfigurationError: A validation interval that does not fit the dataloader.
        """
        config = run.config
        self.accumulate_grad_batches = config.accumulate_grad_batches
        self.dataloader = prepare_loader(  # overfitting repeats the same first batches: in order
            loader,
            run.strategy,
            use_distributed_sampler=config.use_distributed_sampler,
            sequential=bool(config.overfit_batches),
        )
        self._generators = generators_of(self.dataloader)
        total = num_batches(self.dataloader)
        self.num_batches = limit_batches(config.limit_train_batches, total, name="limit_train_batches")
        self.val_check_batch = val_check_batch(config, self.num_batches)

    def estimated_stepping_batches(self, config: TrainerConfig, factor_at: Callable[[int], int] | None = None) -> float:
        """Optimizer steps a fit with ``config`` takes from the start (see ``Trainer.estimated_stepping_batches``).

        Args:
            config: The Trainer's arguments (epochs, steps, ``accumulate_grad_batches``).
            factor_at: The accumulation factor of each epoch when a schedule changes it
                (GradientAccumulationScheduler); None: ``config.accumulate_grad_batches`` throughout.
        """
        if config.max_epochs == -1 or math.isinf(self.num_batches):
            by_epochs = math.inf
        elif factor_at is None:
            by_epochs = math.ceil(self.num_batches / config.accumulate_grad_batches) * config.max_epochs
        else:  # the last partial window of each epoch steps too, so each epoch is counted on its own
            by_epochs = sum(math.ceil(self.num_batches / factor_at(epoch)) for epoch in range(config.max_epochs))
        return float(by_epochs if config.max_steps == -1 else min(config.max_steps, by_epochs))

    # ------------------------------------------------------------------ running
    def done(self, run: Run) -> bool:
        """Whether max_steps / max_epochs is reached or a callback set ``trainer.should_stop``."""
        config = run.config
        if config.max_steps != -1 and self.global_step >= config.max_steps:
            return True
        if config.max_epochs != -1 and self.epoch >= config.max_epochs:
            return True
        return run.should_stop and self.can_stop_early(config)

    def can_stop_early(self, config: TrainerConfig) -> bool:
        """Whether ``min_epochs`` / ``min_steps`` are reached, so ``trainer.should_stop`` may end fit."""
        enough_epochs = config.min_epochs is None or self.epoch >= config.min_epochs
        enough_steps = config.min_steps is None or self.global_step >= config.min_steps
        return enough_epochs and enough_steps

    def run(self, run: Run) -> None:
        """Train until done (after the sanity validation)."""
        config = run.config
        run_sanity_check(run, self._generators)
        if self.num_batches == 0:
            warnings.warn("Trainer(limit_train_batches=0): no training batches, training is skipped.", stacklevel=2)
            return
        if self.done(run):
            warnings.warn(
                f"fit() has nothing to do: the run is already at epoch {self.epoch}, step {self.global_step} "
                f"(max_epochs={config.max_epochs}, max_steps={config.max_steps}). Raise the limits to train more.",
                stacklevel=2,
            )
            return
        if isinstance(config.val_check_interval, timedelta):
            self.last_val_time = time.monotonic()
        # What on_train_start logs belongs to the first epoch's aggregates, as in Lightning: the store is
        # emptied here (a resumed epoch keeps its restored partial aggregates) and not again at that epoch's start.
        self._keep_train_metrics = True
        if self._resume is None:
            run.metrics.reset("train")
        run.hooks.call("on_train_start")
        run.strategy.on_train_start()
        run.training_step_runs_backward = bool(run.strategy.training_step_runs_backward)
        run.step_takes_batch_idx = takes_batch_idx(run.module.training_step)
        self._direct_candidate = direct_step(run)
        self._strategy_batch_hook = is_overridden(
            "on_train_batch_start", run.strategy, Strategy
        )  # a no-op is not called
        profiler = run.profiler
        while not self.done(run):
            if profiler is None:
                self.run_epoch(run)
            else:
                with profiler.profile("run_training_epoch"):
                    self.run_epoch(run)
        run.hooks.call("on_train_end")
        run.strategy.on_train_end()

    def _reload_dataloader(self, run: Run) -> None:
        """``reload_dataloaders_every_n_epochs``: ask the hook for the training data again."""
        loader = reload_train_loader(run)
        if loader is not None:
            config = run.config
            self.dataloader = prepare_loader(
                loader,
                run.strategy,
                use_distributed_sampler=config.use_distributed_sampler,
                sequential=bool(config.overfit_batches),
            )
            self._generators = generators_of(self.dataloader)
            self.num_batches = limit_batches(
                config.limit_train_batches, num_batches(self.dataloader), name="limit_train_batches"
            )

    def run_epoch(self, run: Run) -> None:
        """One epoch, or the rest of a resumed one."""
        config = run.config
        resume, self._resume = self._resume, None
        keep, self._keep_train_metrics = self._keep_train_metrics, False
        if resume is not None and resume["phase"] == "epoch_end":
            restore_rng(resume["rng"].get("current"), self._generators)
            self._finish_epoch(run, run_hooks=False)
            return
        run.stage = RunningStage.TRAINING
        loader = self.dataloader
        set_sampler_epoch(loader, self.epoch)
        start = resume["batches_done"] if resume is not None else 0
        if resume is None:
            every = config.reload_dataloaders_every_n_epochs
            if every and self.epoch > 0 and self.epoch % every == 0:
                self._reload_dataloader(run)
                loader = self.dataloader
                set_sampler_epoch(loader, self.epoch)
            self._restarting = False
            self.batches_done = 0
            self.phase = "train"
            self._regrouped = None
            run.val_loop.start_fit_epoch()  # its batch_progress.total counts this epoch's validation batches
            if not keep:
                run.metrics.reset("train")
            run.hooks.call("on_train_epoch_start")
            self._epoch_start_rng = capture_rng(self._generators)
            iterator = iter(loader)
        else:
            self._epoch_start_rng = resume["rng"].get("epoch_start")
            iterator = iter(())
            self._regrouped = regroup_resumed_epoch(self.dataloader, resume, self.epoch, self.accumulate_grad_batches)
            if self._regrouped is not None:  # another replica count: the rest of the epoch, split anew
                start = self.batches_done = int(min(self._regrouped.start, self.num_batches))
            if start < self.num_batches:
                restore_rng(self._epoch_start_rng, self._generators)
                iterator = (
                    iter(self._regrouped.loader) if self._regrouped is not None else iterate_skipping(loader, start)
                )
            restore_rng(resume["rng"].get("current"), self._generators)
            if resume["phase"] == "train" and start > 0:
                self._check_validation(run, start - 1, is_last=start == self.num_batches)
        # Accumulation is fixed for the epoch from here (a schedule sets it in on_train_epoch_start):
        # the direct step, which never accumulates, serves the epochs without it.
        self._direct = self._direct_candidate if self.accumulate_grad_batches == 1 else None
        sized = not math.isinf(self.num_batches)
        lookahead = None if sized else with_last(iterator)
        batch_idx = start
        while batch_idx < self.num_batches:
            if config.max_steps != -1 and self.global_step >= config.max_steps:
                return  # stopped mid-epoch: the epoch stays open so a resume continues it
            try:
                if lookahead is None:
                    batch, is_last = next(iterator), batch_idx + 1 == self.num_batches
                else:
                    batch, is_last = next(lookahead)
            except StopIteration:
                break
            self.is_last_batch = is_last
            if run.profiler is None:
                ended = self._run_batch(run, batch, batch_idx, is_last)
            else:
                with run.profiler.profile("run_training_batch"):
                    ended = self._run_batch(run, batch, batch_idx, is_last)
            if ended:
                break
            if run.has_validation:
                self._check_validation(run, batch_idx, is_last)
            else:
                self.phase = "val"  # what _check_validation records when there is nothing to run
            batch_idx += 1
            verdict = self.preemption.at_step_boundary(run, self.global_step)  # ranks agree (collective)
            if verdict == "preempted":
                return  # checkpoint written; the epoch stays open so a resume continues it
            if verdict == "stop" and self.can_stop_early(config):
                break
        self._finish_epoch(run, run_hooks=True)
        self.preemption.agree_at_epoch_end(run)

    def _run_batch(self, run: Run, batch: Any, batch_idx: int, is_last: bool) -> bool:
        """Train on one batch; True when ``on_train_batch_start`` returned -1 (end the epoch).

        This is the per-step hot path: work with nothing to do (hooks nobody overrides, an empty
        metric flush, schedulers that do not exist) is skipped by a test here rather than a call,
        which keeps the loop's per-step cost next to the plain loop's (see benchmarks/).
        """
        strategy = run.strategy
        metrics = run.metrics
        hooks = run.hooks
        live = hooks.live
        self.total_batch_idx = self.total_batches_done
        batch = strategy.batch_to_device(batch)
        metrics.begin_batch(batch)
        if "on_train_batch_start" in live and hooks.call("on_train_batch_start", batch, batch_idx) == -1:
            return True
        if self._strategy_batch_hook:
            strategy.on_train_batch_start(batch, batch_idx)
        steps_before = self.global_step
        if run.module.automatic_optimization:
            if self._direct is not None:
                step_now = True  # no accumulation on this path
                outputs = run_direct(run, self._direct, batch, batch_idx)
            else:
                step_now = is_last or (batch_idx + 1) % self.accumulate_grad_batches == 0
                outputs = run_automatic(run, batch, batch_idx, step_now=step_now)
            if step_now:
                self.global_step += 1
                if strategy.lr_scheduler_configs:
                    step_schedulers(run, "step", global_step=self.global_step, epoch=self.epoch)
        else:
            hooks.current = "training_step"
            outputs = (
                strategy.training_step(batch, batch_idx) if run.step_takes_batch_idx else strategy.training_step(batch)
            )
        self.batches_done = batch_idx + 1
        self.total_batches_done += 1
        self.phase = "train"
        if metrics.step_updates:
            metrics.flush_step()
        if "on_train_batch_end" in live:
            hooks.call("on_train_batch_end", outputs, batch, batch_idx)
            if metrics.step_updates:
                metrics.flush_step()
        if self.global_step != steps_before and self.global_step % run.config.log_every_n_steps == 0:
            metrics.log_step_metrics(self.global_step - 1)
        return False

    def _check_validation(self, run: Run, batch_idx: int, is_last: bool) -> None:
        """Run validation when due, without disturbing the training random streams."""
        self.phase = "val"
        due = should_validate(
            run, self.val_check_batch, epoch=self.epoch, batch_idx=batch_idx, total=self.total_batches_done, is_last=is_last
        )
        if not due:
            return
        if not self.mid_accumulation:
            run.hooks.call_module("on_validation_model_zero_grad")  # free the gradients' memory while validating
        self._rng_before_val = capture_rng(self._generators)
        try:
            run.val_loop.run(run)
        finally:
            restore_rng(self._rng_before_val, self._generators)
            self._rng_before_val = None
            run.stage = RunningStage.TRAINING
        if isinstance(run.config.val_check_interval, timedelta):
            self.last_val_time = time.monotonic()

    def _finish_epoch(self, run: Run, *, run_hooks: bool) -> None:
        if run_hooks:
            self.phase = "epoch_end"
            trainer, module, hooks, metrics = run.trainer, run.module, run.hooks, run.metrics
            hooks.current = "on_train_epoch_end"
            metrics.epoch_end_reached("train")
            for hook in hooks.epoch_end_first:
                hook(trainer, module)
            module.on_train_epoch_end()
            hooks.current = "on_train_epoch_end"
            metrics.epoch_end("train", write=False)
            for hook in hooks.epoch_end_monitoring:
                hook(trainer, module)
            metrics.write_epoch()
            hooks.current = None
        step_schedulers(run, "epoch", global_step=self.global_step, epoch=self.epoch)
        self.epoch += 1
        self.batches_done = 0
        self._regrouped = None
        self.phase = "train"

# --- When fit validates -----------------------------------------------------------------------------
# When fit validates: ``val_check_interval`` resolved against the epoch, and the check per batch.
#
# Lightning's rules: an int interval counts batches (within the epoch, or across epochs with
# ``check_val_every_n_epoch=None``), a float is a fraction of the epoch (1.0: at its end), and
# ``check_val_every_n_epoch`` skips whole epochs. A duration (``"DD:HH:MM:SS"``, a timedelta)
# validates after the first batch that ends once that much wall-clock time has passed since fit
# started or the last validation ended.


def val_check_batch(config: TrainerConfig, num_batches: float) -> float:
    """Batches between validation checks (``inf``: at the end of the epoch only).

    Raises:
        MisconfigurationError: An interval that does not fit the training dataloader.
    """
    interval = config.val_check_interval
    if isinstance(interval, timedelta):
        return math.inf  # decided by the clock (should_validate), not by a batch count
    if isinstance(interval, int):
        if config.check_val_every_n_epoch is not None and interval > num_batches:
            msg = (
                f"Trainer(val_check_interval={interval}) must be less than or equal to the number of the training "
                f"batches of an epoch ({int(num_batches)}). Pass a smaller value, or check_val_every_n_epoch=None "
                "to count batches across epochs; to disable validation use limit_val_batches=0."
            )
            raise MisconfigurationError(msg)
        return float(interval)
    if math.isinf(num_batches):
        if interval != 1.0:
            msg = (
                f"Trainer(val_check_interval={interval}) is a fraction of an epoch, but the training dataloader "
                "has no length. Pass an int number of batches instead."
            )
            raise MisconfigurationError(msg)
        return math.inf
    return float(max(1, int(num_batches * interval)))


def should_validate(run: Run, every_batches: float, *, epoch: int, batch_idx: int, total: int, is_last: bool) -> bool:
    """Whether validation is due after batch ``batch_idx`` of ``epoch`` (``total`` batches done in fit)."""
    if not run.has_validation:
        return False
    every = run.config.check_val_every_n_epoch
    if every is not None and (epoch + 1) % every != 0:
        return False
    interval = run.config.val_check_interval
    if isinstance(interval, timedelta):
        # One clock reading per batch, in validating epochs only, as in Lightning: due once the
        # interval has passed since fit started or the last validation ended.
        if is_last and math.isinf(run.fit_loop.num_batches):
            return True
        return time.monotonic() - run.fit_loop.last_val_time >= interval.total_seconds()
    if math.isinf(every_batches):
        return is_last
    current = total if every is None else batch_idx + 1
    return current % every_batches == 0

# --- Learning-rate schedulers -----------------------------------------------------------------------
# Stepping the learning-rate schedulers the module configured, at their interval and frequency.
#
# Lightning's rules: ``interval`` "step" counts optimizer steps, "epoch" completed epochs; a
# ``ReduceLROnPlateau`` reads its ``monitor`` from the logged metrics, and a missing one is an error
# (or, with ``strict: False``, a warning). Manual optimization steps its own schedulers.


def step_schedulers(run: Run, interval: str, *, global_step: int, epoch: int) -> None:
    """Step every scheduler of ``interval`` ("step" or "epoch") that is due at this position."""
    configs = run.strategy.lr_scheduler_configs
    if not configs or not run.module.automatic_optimization:
        return
    callback_metrics = run.metrics.callback_metrics
    for config in configs:
        if config.interval != interval:
            continue
        index = global_step if interval == "step" else epoch + 1
        if index % config.frequency:
            continue
        if config.reduce_on_plateau:
            value = callback_metrics.get(config.monitor or "")
            if value is None:
                msg = (
                    f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; logged metrics: "
                    f"{sorted(callback_metrics)}. Log it with self.log({config.monitor!r}, ...) or "
                    "set 'strict': False in the scheduler dict."
                )
                if config.strict:
                    raise MisconfigurationError(msg)
                warnings.warn(msg, stacklevel=2)
                continue
            run.module.lr_scheduler_step(config.scheduler, float(value))
        else:
            run.module.lr_scheduler_step(config.scheduler, None)

# --- The sanity check -------------------------------------------------------------------------------
# Lightning's sanity check: a few validation batches before training, to fail fast.


def run_sanity_check(run: Run, generators: Any) -> None:
    """Validate ``num_sanity_val_steps`` batches per dataloader before training, to fail fast.

    Lightning's sanity check: callbacks see ``trainer.sanity_checking``; nothing is logged,
    the metrics and the random streams are as before, so training computes what it would without it.
    """
    limit = run.config.num_sanity_val_steps
    if not limit or not run.has_validation:
        return
    hooks, metrics = run.hooks, run.metrics
    saved = (dict(metrics.callback_metrics), dict(metrics.progress_bar), capture_rng(generators))
    run.stage = RunningStage.SANITY_CHECKING
    try:
        hooks.call_callbacks("on_sanity_check_start")
        run.val_loop.run(run, max_batches=limit, stage=RunningStage.SANITY_CHECKING)
        hooks.call_callbacks("on_sanity_check_end")
    finally:
        run.stage = RunningStage.TRAINING
        metrics.callback_metrics.clear()
        metrics.callback_metrics.update(saved[0])
        metrics.progress_bar.clear()
        metrics.progress_bar.update(saved[1])
        restore_rng(saved[2], generators)
        run.val_loop.has_run = False
