"""Two groups of the Trainer's read-only properties: its configuration and its data.

Mixed into :class:`~phalanx.trainer.properties.TrainerProperties` (the TrainerView half of the
Trainer); kept apart so that each file reads as one thing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phalanx.trainer.config import TrainerConfig
    from phalanx.trainer.evaluation_loop import EvaluationLoop
    from phalanx.trainer.fit_loop import FitLoop
    from phalanx.trainer.predict_loop import PredictLoop
    from phalanx.trainer.run import Run

__all__ = ["ConfigProperties", "DataProperties"]


def _config_property(name: str, doc: str) -> property:
    """A read-only ``Trainer`` attribute backed by its :class:`TrainerConfig`."""

    def get(self: ConfigProperties) -> Any:
        return getattr(self.config, name)

    return property(get, doc=doc)



def _one_or_list(loaders: list[Any]) -> Any:
    if not loaders:
        return None
    return loaders[0] if len(loaders) == 1 else list(loaders)


class ConfigProperties:
    """``Trainer(...)`` arguments, read back: each reads the :class:`TrainerConfig`."""

    config: TrainerConfig

    num_nodes = _config_property("num_nodes", "Machines taking part.")
    @property
    def max_epochs(self) -> int | None:
        """The epoch limit (-1: none); None while ``Trainer(max_epochs=None)`` waits for ``fit`` to settle it."""
        return self.config.max_epochs if self.config.max_epochs_set else None

    max_steps = _config_property("max_steps", "The optimizer-step limit (-1: none).")
    limit_train_batches = _config_property("limit_train_batches", "Training batches per epoch (fraction or count).")
    limit_val_batches = _config_property("limit_val_batches", "Validation batches per run (fraction or count).")
    limit_test_batches = _config_property("limit_test_batches", "Test batches (fraction or count).")
    limit_predict_batches = _config_property("limit_predict_batches", "Predict batches (fraction or count).")
    val_check_interval = _config_property("val_check_interval", "Validate every N batches or fraction of an epoch.")
    check_val_every_n_epoch = _config_property("check_val_every_n_epoch", "Validate every N epochs.")
    gradient_clip_val = _config_property("gradient_clip_val", "Clip gradients to this norm/value (None: off).")
    gradient_clip_algorithm = _config_property("gradient_clip_algorithm", "'norm' or 'value'.")
    log_every_n_steps = _config_property("log_every_n_steps", "How often step metrics go to the loggers.")
    use_distributed_sampler = _config_property("use_distributed_sampler", "Shard data with a DistributedSampler.")
    sync_batchnorm = _config_property("sync_batchnorm", "Convert BatchNorm layers to SyncBatchNorm.")
    deterministic = _config_property("deterministic", "Deterministic algorithms (True, False or 'warn').")
    default_root_dir = _config_property("default_root_dir", "Where logs and checkpoints go without a logger.")
    min_epochs = _config_property("min_epochs", "Epochs before ``should_stop`` may end fit (None: no minimum).")
    min_steps = _config_property("min_steps", "Optimizer steps before ``should_stop`` may end fit (None: no minimum).")
    max_time = _config_property("max_time", "The time budget of fit (a timedelta), or None.")
    num_sanity_val_steps = _config_property("num_sanity_val_steps", "Validation batches checked before training (inf: all).")
    fast_dev_run = _config_property("fast_dev_run", "Batches per loop of a fast_dev_run (0: off).")
    overfit_batches = _config_property("overfit_batches", "Batches trained and validated on repeatedly (0: off).")
    reload_dataloaders_every_n_epochs = _config_property(
        "reload_dataloaders_every_n_epochs", "Ask for the training data again every N epochs (0: never)."
    )
    inference_mode = _config_property("inference_mode", "Evaluate under torch.inference_mode (else no_grad).")
    barebones = _config_property("barebones", "Whether everything that costs time (logging, checkpoints, bars) is off.")


class DataProperties:
    """The dataloaders of the stages, their batch counts, and the DataModule."""

    config: TrainerConfig
    fit_loop: FitLoop
    val_loop: EvaluationLoop
    test_loop: EvaluationLoop
    predict_loop: PredictLoop
    run: Run | None
    _datamodule: Any

    @property
    def validation_enabled(self) -> bool:
        """Whether this fit validates at all (validation data and a ``validation_step``)."""
        return self.run is not None and self.run.has_validation

    @property
    def datamodule(self) -> Any:
        """The DataModule of the stage in progress (or the last one), or None when the data came otherwise."""
        return self._datamodule

    @property
    def enable_validation(self) -> bool:
        """Whether fit can validate: validation batches and a ``validation_step``."""
        return self.validation_enabled

    @property
    def train_dataloader(self) -> Any:
        """The training dataloader of the current fit (as prepared: sharded, limited), or None."""
        return self.fit_loop.dataloader

    @property
    def val_dataloaders(self) -> Any:
        """The validation dataloader (a list with several), or None."""
        return _one_or_list(self.val_loop.dataloaders)

    @property
    def test_dataloaders(self) -> Any:
        """The test dataloader (a list with several), or None."""
        return _one_or_list(self.test_loop.dataloaders)

    @property
    def predict_dataloaders(self) -> Any:
        """The predict dataloader (a list with several), or None."""
        return _one_or_list(self.predict_loop.dataloaders)

    @property
    def num_sanity_val_batches(self) -> list[float]:
        """Batches per validation dataloader the sanity check runs."""
        return [min(self.config.num_sanity_val_steps, n) for n in self.val_loop.num_batches]

    @property
    def num_training_batches(self) -> float:
        """Training batches per epoch after ``limit_train_batches`` (``inf`` without a length)."""
        return self.fit_loop.num_batches

    @property
    def num_val_batches(self) -> list[float]:
        """Validation batches per dataloader."""
        return list(self.val_loop.num_batches)

    @property
    def num_test_batches(self) -> list[float]:
        """Test batches per dataloader."""
        return list(self.test_loop.num_batches)

    @property
    def num_predict_batches(self) -> list[float]:
        """Predict batches per dataloader."""
        return list(self.predict_loop.num_batches)
