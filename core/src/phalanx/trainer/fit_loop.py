"""The fit loop: epochs, batches, accumulation, validation checks, schedulers, loop position.

The loop's position is explicit state (epoch, optimizer steps, batches done in the epoch, and which
post-batch work is done: ``phase``), so a checkpoint taken anywhere in fit (after a batch, during
validation, at epoch end) restores to exactly the next piece of work. Validation runs with the
training random streams saved and put back, so evaluating never changes what training computes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from phalanx.errors import MisconfigurationError
from phalanx.strategies._hooks import StrategyHooks
from phalanx.trainer.checkpointing import capture_rng, restore_rng
from phalanx.trainer.data import (
    generators_of,
    iterate_skipping,
    limit_batches,
    num_batches,
    prepare_loader,
    set_sampler_epoch,
)
from phalanx.trainer.optimization import direct_step, run_automatic, run_direct
from phalanx.trainer.preemption import Preemption
from phalanx.trainer.state import RunningStage

if TYPE_CHECKING:
    from phalanx.trainer.trainer import Trainer

__all__ = ["FitLoop"]

#: Work done for the last completed batch: its training ("train"), its validation check ("val"),
#: or the epoch-end hooks ("epoch_end", only the epoch schedulers remain).
PHASES = ("train", "val", "epoch_end")


def _with_last(iterator: Iterator[Any]) -> Iterator[tuple[Any, bool]]:
    """Yield ``(batch, is_last)`` with one batch of lookahead (for loaders without a length)."""
    try:
        previous = next(iterator)
    except StopIteration:
        return
    for item in iterator:
        yield previous, False
        previous = item
    yield previous, True


class FitLoop:
    """Runs training epochs for :meth:`Trainer.fit`."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.epoch = 0
        self.global_step = 0
        self.batches_done = 0
        self.total_batches_done = 0
        self.phase = "train"
        self.dataloader: Any = None
        self.num_batches: float = math.inf
        self.val_check_batch: float = math.inf
        self._generators: list[Any] = []
        self._epoch_start_rng: dict[str, Any] | None = None
        self._rng_before_val: dict[str, Any] | None = None
        self._resume: dict[str, Any] | None = None
        self._last_logged_step = -1
        self._direct: Any = None  # the step run_direct calls, when it replaces the layered step
        self._strategy_batch_hook = True
        self.preemption = Preemption(trainer)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The loop position (recorded in checkpoints under ``loops.fit``)."""
        return {
            "epoch": self.epoch,
            "global_step": self.global_step,
            "batches_done": self.batches_done,
            "total_batches_done": self.total_batches_done,
            "phase": self.phase,
            "sampler_epoch": self.epoch,
            "num_batches": None if math.isinf(self.num_batches) else int(self.num_batches),
        }

    @property
    def mid_accumulation(self) -> bool:
        """Whether gradients of an unfinished accumulation window are pending (they go into checkpoints)."""
        trainer = self.trainer
        return (
            self.phase != "epoch_end"
            and 0 < self.batches_done < self.num_batches
            and self.batches_done % trainer.accumulate_grad_batches != 0
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
        self.phase = state.get("phase", "train")
        self._resume = {"batches_done": self.batches_done, "phase": self.phase, "rng": rng or {}}
        saved_batches = state.get("num_batches")
        if saved_batches is not None and not math.isinf(self.num_batches) and saved_batches != self.num_batches:
            warnings.warn(
                f"The checkpoint's epoch had {saved_batches} training batches, this run has {int(self.num_batches)}; "
                "the data changed, so the resumed run cannot match the original exactly.",
                stacklevel=2,
            )

    # ------------------------------------------------------------------ setup
    def setup(self, loader: Any) -> None:
        """Prepare the training dataloader and the validation schedule.

        Raises:
            MisconfigurationError: A validation interval that does not fit the dataloader.
        """
        trainer = self.trainer
        self.dataloader = prepare_loader(
            loader, trainer.strategy, use_distributed_sampler=trainer.use_distributed_sampler
        )
        self._generators = generators_of(self.dataloader)
        total = num_batches(self.dataloader)
        self.num_batches = limit_batches(trainer.limit_train_batches, total, name="limit_train_batches")
        interval = trainer.val_check_interval
        if isinstance(interval, int):
            if trainer.check_val_every_n_epoch is not None and interval > self.num_batches:
                msg = (
                    f"Trainer(val_check_interval={interval}) is larger than the {int(self.num_batches)} training "
                    "batches of an epoch. Pass a smaller value, or check_val_every_n_epoch=None to count batches "
                    "across epochs; to disable validation use limit_val_batches=0."
                )
                raise MisconfigurationError(msg)
            self.val_check_batch = float(interval)
        elif math.isinf(self.num_batches):
            if interval != 1.0:
                msg = (
                    f"Trainer(val_check_interval={interval}) is a fraction of an epoch, but the training dataloader "
                    "has no length. Pass an int number of batches instead."
                )
                raise MisconfigurationError(msg)
            self.val_check_batch = math.inf
        else:
            self.val_check_batch = float(max(1, int(self.num_batches * interval)))

    # ------------------------------------------------------------------ running
    @property
    def done(self) -> bool:
        """Whether max_steps / max_epochs is reached or a callback set ``trainer.should_stop``."""
        trainer = self.trainer
        if trainer.max_steps != -1 and self.global_step >= trainer.max_steps:
            return True
        if trainer.max_epochs != -1 and self.epoch >= trainer.max_epochs:
            return True
        return trainer.should_stop

    def run(self) -> None:
        """Train until done."""
        trainer = self.trainer
        if self.num_batches == 0:
            warnings.warn("Trainer(limit_train_batches=0): no training batches, training is skipped.", stacklevel=2)
            return
        if self.done:
            warnings.warn(
                f"fit() has nothing to do: the run is already at epoch {self.epoch}, step {self.global_step} "
                f"(max_epochs={trainer.max_epochs}, max_steps={trainer.max_steps}). Raise the limits to train more.",
                stacklevel=2,
            )
            return
        trainer._call_hooks("on_train_start")
        trainer.strategy.on_train_start()
        self._direct = direct_step(trainer)
        hook = type(trainer.strategy).on_train_batch_start
        self._strategy_batch_hook = hook is not StrategyHooks.on_train_batch_start  # a no-op is not called
        while not self.done:
            self.run_epoch()
        trainer._call_hooks("on_train_end")
        trainer.strategy.on_train_end()

    def run_epoch(self) -> None:
        """One epoch, or the rest of a resumed one."""
        trainer = self.trainer
        resume, self._resume = self._resume, None
        if resume is not None and resume["phase"] == "epoch_end":
            restore_rng(resume["rng"].get("current"), self._generators)
            self._finish_epoch(run_hooks=False)
            return
        trainer.state.stage = RunningStage.TRAINING
        loader = self.dataloader
        set_sampler_epoch(loader, self.epoch)
        start = resume["batches_done"] if resume is not None else 0
        if resume is None:
            self.batches_done = 0
            self.phase = "train"
            trainer._logger_connector.reset("train")
            trainer._call_hooks("on_train_epoch_start")
            self._epoch_start_rng = capture_rng(self._generators)
            iterator = iter(loader)
        else:
            self._epoch_start_rng = resume["rng"].get("epoch_start")
            iterator = iter(())
            if start < self.num_batches:
                restore_rng(self._epoch_start_rng, self._generators)
                iterator = iterate_skipping(loader, start)
            restore_rng(resume["rng"].get("current"), self._generators)
            if resume["phase"] == "train" and start > 0:
                self._check_validation(start - 1, is_last=start == self.num_batches)
        sized = not math.isinf(self.num_batches)
        lookahead = None if sized else _with_last(iterator)
        batch_idx = start
        while batch_idx < self.num_batches:
            if trainer.max_steps != -1 and self.global_step >= trainer.max_steps:
                return  # stopped mid-epoch: the epoch stays open so a resume continues it
            try:
                if lookahead is None:
                    batch, is_last = next(iterator), batch_idx + 1 == self.num_batches
                else:
                    batch, is_last = next(lookahead)
            except StopIteration:
                break
            if self._run_batch(batch, batch_idx, is_last):
                break
            if trainer._has_validation:
                self._check_validation(batch_idx, is_last)
            else:
                self.phase = "val"  # what _check_validation records when there is nothing to run
            batch_idx += 1
            if self.preemption.should_stop(self.global_step):
                return  # preempted: checkpoint written; the epoch stays open so a resume continues it
            if trainer.should_stop:
                break
        self._finish_epoch(run_hooks=True)

    def _run_batch(self, batch: Any, batch_idx: int, is_last: bool) -> bool:
        """Train on one batch; True when ``on_train_batch_start`` returned -1 (end the epoch).

        This is the per-step hot path: work with nothing to do (hooks nobody overrides, an empty
        metric flush, schedulers that do not exist) is skipped by a test here rather than a call,
        which keeps the loop's per-step cost next to the plain loop's (see benchmarks/).
        """
        trainer = self.trainer
        strategy = trainer._strategy
        connector = trainer._logger_connector
        live = trainer._live_hooks
        batch = strategy.batch_to_device(batch)
        connector.begin_batch(batch)
        if "on_train_batch_start" in live and trainer._call_hooks("on_train_batch_start", batch, batch_idx) == -1:
            return True
        if self._strategy_batch_hook:
            strategy.on_train_batch_start(batch, batch_idx)
        steps_before = self.global_step
        if trainer._module.automatic_optimization:
            if self._direct is not None:
                step_now = True  # no accumulation on this path
                outputs = run_direct(trainer, self._direct, batch, batch_idx)
            else:
                step_now = is_last or (batch_idx + 1) % trainer.accumulate_grad_batches == 0
                outputs = run_automatic(trainer, batch, batch_idx, step_now=step_now)
            if step_now:
                self.global_step += 1
                if strategy.lr_scheduler_configs:
                    self._step_schedulers("step")
        else:
            trainer._current_fx = "training_step"
            outputs = strategy.training_step(batch, batch_idx)
        self.batches_done = batch_idx + 1
        self.total_batches_done += 1
        self.phase = "train"
        if connector._step_updates:
            connector.flush_step()
        if "on_train_batch_end" in live:
            trainer._call_hooks("on_train_batch_end", outputs, batch, batch_idx)
            if connector._step_updates:
                connector.flush_step()
        if self.global_step != steps_before and self.global_step % trainer.log_every_n_steps == 0:
            connector.log_step_metrics(self.global_step - 1)
        return False

    def _should_validate(self, batch_idx: int, is_last: bool) -> bool:
        trainer = self.trainer
        if not trainer._has_validation:
            return False
        every = trainer.check_val_every_n_epoch
        if every is not None and (self.epoch + 1) % every != 0:
            return False
        if math.isinf(self.val_check_batch):
            return is_last
        current = self.total_batches_done if every is None else batch_idx + 1
        return current % self.val_check_batch == 0

    def _check_validation(self, batch_idx: int, is_last: bool) -> None:
        """Run validation when due, without disturbing the training random streams."""
        self.phase = "val"
        if not self._should_validate(batch_idx, is_last):
            return
        trainer = self.trainer
        self._rng_before_val = capture_rng(self._generators)
        try:
            trainer.val_loop.run()
        finally:
            restore_rng(self._rng_before_val, self._generators)
            self._rng_before_val = None
            trainer.state.stage = RunningStage.TRAINING

    def _finish_epoch(self, *, run_hooks: bool) -> None:
        trainer = self.trainer
        if run_hooks:
            self.phase = "epoch_end"
            module = trainer._module
            connector = trainer._logger_connector
            trainer._current_fx = "on_train_epoch_end"
            for hook in trainer._epoch_end_hooks[False]:
                hook(trainer, module)
            module.on_train_epoch_end()
            trainer._current_fx = "on_train_epoch_end"
            connector.epoch_end("train", write=False)
            for hook in trainer._epoch_end_hooks[True]:
                hook(trainer, module)
            connector.write_epoch()
            trainer._current_fx = None
        self._step_schedulers("epoch")
        self.epoch += 1
        self.batches_done = 0
        self.phase = "train"

    def _step_schedulers(self, interval: str) -> None:
        trainer = self.trainer
        configs = trainer._strategy.lr_scheduler_configs
        if not configs or not trainer._module.automatic_optimization:
            return
        for config in configs:
            if config.interval != interval:
                continue
            index = self.global_step if interval == "step" else self.epoch + 1
            if index % config.frequency:
                continue
            if config.reduce_on_plateau:
                value = trainer.callback_metrics.get(config.monitor)
                if value is None:
                    msg = (
                        f"ReduceLROnPlateau monitors {config.monitor!r}, which was not logged; logged metrics: "
                        f"{sorted(trainer.callback_metrics)}. Log it with self.log({config.monitor!r}, ...) or "
                        "set 'strict': False in the scheduler dict."
                    )
                    if config.strict:
                        raise MisconfigurationError(msg)
                    warnings.warn(msg, stacklevel=2)
                    continue
                config.scheduler.step(float(value))
            else:
                config.scheduler.step()
