"""ThroughputMonitor: log samples, batches, items and FLOPs per second, and MFU, while running.

Speed problems (a slow dataloader, a sync point, an unused accelerator) hide behind a good loss
curve; this callback puts the rates next to it, under Lightning's keys: ``train/device/samples_per_sec``,
``train/device/flops_per_sec``, ``train/device/mfu`` ... (``validate/``, ``test/``, ``predict/`` for
the other loops), plus the global ``train/samples_per_sec`` & co. when several processes run.

Timing is taken on global rank 0 only, after each batch (a CUDA synchronisation first, so the clock
sees finished work). In training the rates are logged when an accumulation window completes (so
the optimizer step is inside the measured time) at the Trainer's ``log_every_n_steps`` cadence;
time spent validating inside fit is taken out of the training clock, so validation does not drag
the training rate down. FLOPs come from the Module's ``flops_per_batch`` attribute, which the user
sets, typically with :func:`phalanx.utilities.throughput.measure_flops`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from phalanx.callbacks.callback import Callback
from phalanx.trainer_view import RunningStage
from phalanx.utilities.rank_zero import rank_zero_warn
from phalanx.utilities.throughput import Throughput, get_available_flops, precision_to_compute_dtype

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["ThroughputMonitor"]


class ThroughputMonitor(Callback):
    """Compute and log throughput with :class:`~phalanx.utilities.throughput.Throughput`.

    Example::

        class MyModel(Module):
            def setup(self, stage):
                with torch.device("meta"):
                    model = MyModel()
                    batch = torch.randn(8, 32, device="meta")
                    self.flops_per_batch = measure_flops(model, lambda: model(batch), loss_fn=torch.Tensor.sum)

        trainer = Trainer(log_every_n_steps=10, callbacks=ThroughputMonitor(batch_size_fn=lambda b: b.size(0)))

    Args:
        batch_size_fn: The number of samples in a batch.
        length_fn: The number of items (e.g. tokens) in a batch; enables ``items_per_sec``.
        **kwargs: Passed to :class:`~phalanx.utilities.throughput.Throughput` (``window_size``,
            ``separator``).
    """

    def __init__(
        self, batch_size_fn: Callable[[Any], int], length_fn: Callable[[Any], int] | None = None, **kwargs: Any
    ) -> None:
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.kwargs = kwargs
        self.available_flops: int | None = None
        self._throughputs: dict[RunningStage, Throughput] = {}
        self._t0s: dict[RunningStage, float] = {}
        self._samples: dict[RunningStage, int] = {}
        self._lengths: dict[RunningStage, int] = {}
        self._batches: dict[RunningStage, int] = {}
        self._iter_nums: dict[RunningStage, int] = {}
        self._module_has_flops: bool | None = None
        Throughput(**kwargs)  # fail on bad arguments now, not at the first stage

    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Look up the device's peak FLOPs for the run's compute dtype; start fresh windows."""
        dtype = precision_to_compute_dtype(trainer.precision)
        self.available_flops = get_available_flops(trainer.strategy.root_device, dtype)
        self._throughputs = {}

    # ------------------------------------------------------------------ measuring
    def _throughput(self, trainer: TrainerView, stage: RunningStage) -> Throughput:
        if stage not in self._throughputs:
            self._throughputs[stage] = Throughput(
                available_flops=self.available_flops, world_size=trainer.world_size, **self.kwargs
            )
        return self._throughputs[stage]

    def _start(self, trainer: TrainerView, stage: RunningStage) -> None:
        # inside fit every loop start is a new measurement; a second test/predict call continues
        if trainer.state.fn == "fit" or stage not in self._samples:
            self._throughput(trainer, stage).reset()
            self._samples[stage] = self._lengths[stage] = self._batches[stage] = 0
        self._t0s[stage] = time.perf_counter()

    @torch.inference_mode()  # in case batch_size_fn or length_fn compute with grads
    def _update(self, trainer: TrainerView, pl_module: Module, batch: Any, stage: RunningStage) -> None:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # or perf_counter would time kernel launches, not kernels
        elapsed = time.perf_counter() - self._t0s[stage]
        if self.length_fn is not None:
            self._lengths[stage] += self.length_fn(batch)
        flops_per_batch = getattr(pl_module, "flops_per_batch", None)
        if self._module_has_flops is None:  # asked once: one warning per callback, not one per batch
            self._module_has_flops = hasattr(pl_module, "flops_per_batch")
            if not self._module_has_flops:
                rank_zero_warn(
                    "When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute or "
                    f"property in {type(pl_module).__name__} to compute the FLOPs."
                )
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        self._iter_nums[stage] = self._iter_nums.get(stage, 0) + 1
        self._throughput(trainer, stage).update(
            time=elapsed,
            batches=self._batches[stage],
            samples=self._samples[stage],
            lengths=None if self.length_fn is None else self._lengths[stage],
            flops=flops_per_batch,
        )

    def _compute(self, trainer: TrainerView, stage: RunningStage, *, step: int | None, logs_now: bool) -> None:
        if not logs_now or trainer.fast_dev_run:
            return
        throughput = self._throughputs[stage]
        metrics = {f"{stage.value}{throughput.separator}{key}": value for key, value in throughput.compute().items()}
        if step is None:  # a training step: Lightning adds the epoch and uses the stepped-batch count
            metrics["epoch"] = trainer.current_epoch
            step = max(trainer.global_step - 1, 0)
        for logger in trainer.loggers:
            logger.log_metrics(metrics=metrics, step=step)  # by keyword, as Lightning calls it

    @staticmethod
    def _eval_logs_now(trainer: TrainerView) -> bool:
        """Lightning's ``should_update_logs``: the *next* optimizer step is on the logging cadence."""
        return (trainer.global_step + 1) % trainer.log_every_n_steps == 0 or trainer.should_stop

    # ------------------------------------------------------------------ training
    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the training clock."""
        if trainer.is_global_zero:
            self._start(trainer, RunningStage.TRAINING)

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Record the batch; log once its accumulation window (and optimizer step) is complete."""
        if not trainer.is_global_zero:
            return
        self._update(trainer, pl_module, batch, RunningStage.TRAINING)
        stepped = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or trainer.is_last_batch
        if stepped:
            logs_now = trainer.global_step % trainer.log_every_n_steps == 0 or trainer.should_stop
            self._compute(trainer, RunningStage.TRAINING, step=None, logs_now=logs_now)

    # ------------------------------------------------------------------ evaluation
    def on_validation_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the validation clock (not for the sanity check)."""
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._start(trainer, RunningStage.VALIDATING)

    def on_validation_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Record and log a validation batch."""
        self._eval_batch(trainer, pl_module, batch, RunningStage.VALIDATING)

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Inside fit, move the training clock forward by the validation pause."""
        if not trainer.is_global_zero or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        train, val = RunningStage.TRAINING, RunningStage.VALIDATING
        if train not in self._t0s or val not in self._t0s:
            return
        train_elapsed = self._throughputs[train].elapsed if train in self._throughputs else 0.0
        val_elapsed = self._throughputs[val].elapsed if val in self._throughputs else 0.0
        training_finished = self._t0s[train] + train_elapsed
        between = self._t0s[val] - training_finished
        self._t0s[train] += between + val_elapsed

    def on_test_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the test clock."""
        if trainer.is_global_zero:
            self._start(trainer, RunningStage.TESTING)

    def on_test_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Record and log a test batch."""
        self._eval_batch(trainer, pl_module, batch, RunningStage.TESTING)

    def on_predict_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the predict clock."""
        if trainer.is_global_zero:
            self._start(trainer, RunningStage.PREDICTING)

    def on_predict_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Record and log a predict batch."""
        self._eval_batch(trainer, pl_module, batch, RunningStage.PREDICTING)

    def _eval_batch(self, trainer: TrainerView, pl_module: Module, batch: Any, stage: RunningStage) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        self._update(trainer, pl_module, batch, stage)
        self._compute(trainer, stage, step=self._iter_nums[stage], logs_now=self._eval_logs_now(trainer))
