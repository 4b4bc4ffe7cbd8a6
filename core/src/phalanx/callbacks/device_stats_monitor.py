"""DeviceStatsMonitor: log the accelerator's statistics (memory, utilisation) around every batch.

Out-of-memory errors and slow steps are easier to explain with the device's memory curve next to
the loss. The numbers come from the strategy's accelerator (``Accelerator.get_device_stats``: the
CUDA caching allocator's ``memory_stats``, the host's ``cpu_percent`` / ``cpu_vm_percent`` /
``cpu_swap_percent`` on CPU), so a vendor's accelerator brings its own statistics. Keys are
Lightning's: ``DeviceStatsMonitor.<hook>/<stat>``, e.g. ``DeviceStatsMonitor.on_train_batch_start/cpu_percent``,
logged at the Trainer's ``log_every_n_steps`` cadence by global rank 0 (loggers run there only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phalanx.accelerators.cpu import get_cpu_stats
from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError
from phalanx.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["DeviceStatsMonitor"]


class DeviceStatsMonitor(Callback):
    """Log device statistics before and after each training, validation and test batch.

    Args:
        cpu_stats: None logs host CPU statistics only when the accelerator is the CPU; True adds
            them to any accelerator's statistics; False logs none on a CPU run.
        filter_keys: Only these statistic names (before prefixing), e.g. ``{"cpu_percent"}``; a
            name no statistic has is warned about once, at setup.

    Raises:
        MisconfigurationError: fit starts without a logger.
    """

    def __init__(self, cpu_stats: bool | None = None, filter_keys: set[str] | None = None) -> None:
        self._cpu_stats = cpu_stats
        self._filter_keys = filter_keys

    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Fail early without a logger; warn about filter keys that match no statistic."""
        if stage != "fit":
            return
        if not trainer.loggers:
            msg = (
                "Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`: it writes to the loggers. "
                "Fix: pass logger=True or a logger, or remove the callback."
            )
            raise MisconfigurationError(msg)
        if self._filter_keys is not None:
            unknown = self._filter_keys - self._stats(trainer).keys()
            if unknown:
                rank_zero_warn(
                    f"`DeviceStatsMonitor` filter_keys contains keys not found in device stats and will be ignored: "
                    f"{sorted(unknown)}"
                )

    def _stats(self, trainer: TrainerView) -> dict[str, Any]:
        device = trainer.strategy.root_device
        stats = dict(trainer.strategy.accelerator.get_device_stats(device))
        if self._cpu_stats and device.type != "cpu":
            stats.update(get_cpu_stats())  # the CPU accelerator already returned them
        return stats

    def _log(self, trainer: TrainerView, hook: str, *, count: int, step: int) -> None:
        every = trainer.log_every_n_steps
        if not (count % every == 0 or trainer.should_stop) or trainer.fast_dev_run or not trainer.is_global_zero:
            return
        if self._cpu_stats is False and trainer.strategy.root_device.type == "cpu":
            return
        stats = self._stats(trainer)
        if self._filter_keys is not None:
            stats = {key: value for key, value in stats.items() if key in self._filter_keys}
        prefix = f"{type(self).__qualname__}.{hook}"
        for logger in trainer.loggers:
            separator = getattr(logger, "group_separator", "/")
            logger.log_metrics({f"{prefix}{separator}{key}": value for key, value in stats.items()}, step)

    # Lightning's cadence: the optimizer step about to complete (or just completed) is a multiple of
    # log_every_n_steps; the step logged is the number of optimizer steps before this batch's.
    def on_train_batch_start(self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int) -> None:
        """Stats before the training step."""
        self._log(trainer, "on_train_batch_start", count=trainer.global_step + 1, step=trainer.global_step)

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Stats after the training step (and the optimizer step when it ran)."""
        stepped = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or trainer.is_last_batch
        before = trainer.global_step - 1 if stepped else trainer.global_step
        self._log(trainer, "on_train_batch_end", count=before + 1, step=max(before, 0))

    def _eval(self, trainer: TrainerView, hook: str) -> None:
        # Lightning logs at its count of batches that stepped, which trails global_step by the
        # batch just stepped while a validation inside fit runs: the step validation metrics use.
        step = max(trainer.global_step - 1, 0) if trainer.state.fn == "fit" else trainer.global_step
        self._log(trainer, hook, count=step + 1, step=step)

    def on_validation_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Stats before a validation step."""
        self._eval(trainer, "on_validation_batch_start")

    def on_validation_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Stats after a validation step."""
        self._eval(trainer, "on_validation_batch_end")

    def on_test_batch_start(
        self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Stats before a test step."""
        self._eval(trainer, "on_test_batch_start")

    def on_test_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Stats after a test step."""
        self._eval(trainer, "on_test_batch_end")
