"""Validation and test loops: the model in eval mode, no gradients, metrics aggregated per run.

One class serves both stages; only the hook and step names differ. With several dataloaders the
step receives ``dataloader_idx`` and logged names get a ``/dataloader_idx_N`` suffix, as in Lightning.
Step-level values (``on_step=True``) go to the loggers after each batch's ``on_*_batch_end`` at the
count of batches this dataloader has evaluated since the loop's data was set up (Lightning's
``_seen_batches_per_dataloader``: it continues across the validations of one fit and restarts
with each ``validate()`` / ``test()`` call; the sanity check neither logs nor counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from phalanx._module_hooks import ModuleHooks
from phalanx.trainer.data import limit_batches, num_batches, prepare_loader
from phalanx.trainer.metrics import MetricStore
from phalanx.trainer.progress import BatchProgress
from phalanx.trainer.step import takes_batch_idx
from phalanx.trainer_view import RunningStage, TrainerFn
from phalanx.utilities.model_helpers import is_overridden

if TYPE_CHECKING:
    from phalanx.trainer.run import Run

__all__ = ["EvaluationLoop", "ModuleModes", "no_grad_context", "profiled"]


def profiled(run: Run, method: Any, action: str) -> Any:
    """``method``, recorded under ``action`` by the Trainer's profiler (itself without one)."""
    profiler = run.profiler
    if profiler is None:
        return method

    def timed(*args: Any) -> Any:
        with profiler.profile(action):
            return method(*args)

    return timed


def no_grad_context(run: Run) -> Any:
    """``torch.inference_mode()`` for evaluation (``Trainer(inference_mode=True)``, Lightning's default)
    where the strategy allows it, else ``torch.no_grad()``."""
    if run.config.inference_mode and run.strategy.supports_inference_mode:
        return torch.inference_mode()
    return torch.no_grad()


@dataclass(frozen=True)
class EvaluationNames:
    """Every name one evaluation stage calls, spelled out (so a search for a hook finds its caller)."""

    running_stage: RunningStage
    limit: str  #: the Trainer argument that caps its batches
    step: str  #: the Module's and the strategy's step method
    start: str
    epoch_start: str
    batch_start: str
    batch_end: str
    epoch_end: str
    end: str
    model_eval: str
    model_train: str


_NAMES = {
    "validate": EvaluationNames(
        RunningStage.VALIDATING,
        "limit_val_batches",
        step="validation_step",
        start="on_validation_start",
        epoch_start="on_validation_epoch_start",
        batch_start="on_validation_batch_start",
        batch_end="on_validation_batch_end",
        epoch_end="on_validation_epoch_end",
        end="on_validation_end",
        model_eval="on_validation_model_eval",
        model_train="on_validation_model_train",
    ),
    "test": EvaluationNames(
        RunningStage.TESTING,
        "limit_test_batches",
        step="test_step",
        start="on_test_start",
        epoch_start="on_test_epoch_start",
        batch_start="on_test_batch_start",
        batch_end="on_test_batch_end",
        epoch_end="on_test_epoch_end",
        end="on_test_end",
        model_eval="on_test_model_eval",
        model_train="on_test_model_train",
    ),
}


class ModuleModes:
    """The ``training`` flag of every submodule of ``module``, captured now, to put back after evaluating.

    ``module.train()`` would switch on submodules the user keeps in eval mode (a frozen backbone, a
    BatchNorm whose statistics must not move); restoring each flag keeps them as they were.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module
        self._modes = {name: sub.training for name, sub in module.named_modules()}

    def restore(self) -> None:
        """Set each submodule's flag back (submodules added since keep theirs)."""
        for name, sub in self._module.named_modules():
            mode = self._modes.get(name)
            if mode is not None:
                sub.training = mode


class EvaluationLoop:
    """Runs ``validation_step`` or ``test_step`` over the evaluation dataloaders.

    Args:
        stage: ``"validate"`` or ``"test"``.
    """

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.names = _NAMES[stage]
        self._running_stage, self._limit_name = self.names.running_stage, self.names.limit
        self.dataloaders: list[Any] = []
        self.num_batches: list[float] = []
        self.has_run = False
        #: Batches evaluated per dataloader since :meth:`setup`: the logger step of step-level metrics.
        self.seen_batches: dict[int, int] = {}
        # Batches evaluated during fit (sanity check excluded): in this training epoch, and in the last run.
        self._fit_batches = (0, 0)

    @property
    def batch_progress(self) -> BatchProgress:
        """Lightning's ``fit_loop.epoch_loop.val_loop.batch_progress``, read-only: ``total.completed``
        counts the validation batches run in the current training epoch (several validations per epoch
        add up), ``current.completed`` those of the latest validation."""
        return BatchProgress.of(*self._fit_batches)

    def start_fit_epoch(self) -> None:
        """A training epoch begins: :attr:`batch_progress` ``total`` counts from zero again, as Lightning's."""
        self._fit_batches = (0, self._fit_batches[1])

    def setup(self, run: Run, loaders: list[Any]) -> None:
        """Prepare the dataloaders and count their batches (after ``limit_*_batches``)."""
        config = run.config
        limit = getattr(config, self._limit_name)
        self.has_run = False
        self.seen_batches = {}
        if run.fn is TrainerFn.FITTING:
            self._fit_batches = (0, 0)
        overfit = bool(config.overfit_batches) and run.fn is TrainerFn.FITTING  # validate on the first batches, in order
        self.dataloaders = [
            prepare_loader(
                loader,
                run.strategy,
                use_distributed_sampler=config.use_distributed_sampler,
                shuffle=False,
                sequential=overfit,
                prefix="val",
            )
            for loader in loaders
        ]
        self.num_batches = [limit_batches(limit, num_batches(dl), name=self._limit_name) for dl in self.dataloaders]

    def run(
        self, run: Run, *, max_batches: float | None = None, stage: RunningStage | None = None
    ) -> list[dict[str, float]]:
        """Evaluate once; returns one dict of epoch metrics per dataloader.

        Args:
            run: The stage's Run.
            max_batches: At most this many batches per dataloader (the sanity check's cap).
            stage: The stage to report (``SANITY_CHECKING`` for the sanity check).
        """
        strategy, hooks, connector, names = run.strategy, run.hooks, run.metrics, self.names
        if self.stage == "validate":
            strategy_step, strategy_start, strategy_end = (
                strategy.validation_step, strategy.on_validation_start, strategy.on_validation_end
            )
        else:
            strategy_step, strategy_start, strategy_end = strategy.test_step, strategy.on_test_start, strategy.on_test_end
        step = profiled(run, strategy_step, f"[Strategy]{type(strategy).__name__}.{names.step}")
        step_name = names.step
        with_batch_idx = takes_batch_idx(getattr(run.module, step_name))
        previous_stage = run.stage
        run.stage = stage or self._running_stage
        connector.stage = self.stage
        connector.reset(self.stage)
        modes = ModuleModes(run.trainer.model)  # the strategy's wrapper too: the default eval hook switches it
        hooks.call_module(names.model_eval)
        multiple = len(self.dataloaders) > 1
        sanity = run.stage is RunningStage.SANITY_CHECKING
        counted = run.fn is TrainerFn.FITTING and not sanity  # what fit_loop...val_loop.batch_progress counts
        if counted:
            self._fit_batches = (self._fit_batches[0], 0)
        try:
            with no_grad_context(run):
                hooks.call(names.start)
                strategy_start()
                hooks.call(names.epoch_start)
                for dataloader_idx, (loader, limit) in enumerate(zip(self.dataloaders, self.num_batches)):
                    if max_batches is not None:
                        limit = min(limit, max_batches)
                    if limit == 0:
                        continue
                    extra = (dataloader_idx,) if multiple else ()
                    for batch_idx, batch in enumerate(loader):
                        if batch_idx >= limit:
                            break
                        batch = strategy.batch_to_device(batch, dataloader_idx=dataloader_idx)
                        connector.begin_batch(batch, dataloader_idx if multiple else None)
                        hooks.call(names.batch_start, batch, batch_idx, *extra)
                        hooks.current = step_name
                        output = step(batch, batch_idx, *extra) if with_batch_idx else step(batch, *extra)
                        connector.flush_step()
                        hooks.call(names.batch_end, output, batch, batch_idx, *extra)
                        if connector.step_updates:
                            connector.flush_step()
                        if counted:
                            self._fit_batches = (self._fit_batches[0] + 1, self._fit_batches[1] + 1)
                        if not sanity:
                            seen = self.seen_batches.get(dataloader_idx, 0)
                            connector.log_eval_step_metrics(seen)
                            self.seen_batches[dataloader_idx] = seen + 1
                connector.begin_batch(None)
                connector.epoch_end_reached(self.stage)
                hooks.call(names.epoch_end)
                published = connector.epoch_end(self.stage)
                self.has_run = True
                hooks.call(names.end)
                strategy_end()
        finally:
            # As Lightning: an overridden on_*_model_train decides; else every submodule gets back the
            # mode it had (a frozen submodule in eval mode stays so during training)
            if is_overridden(names.model_train, run.module, ModuleHooks):
                hooks.call_module(names.model_train)
            else:
                modes.restore()
            connector.stage = "train"
            run.stage = previous_stage
        return MetricStore.results(published, len(self.dataloaders))
