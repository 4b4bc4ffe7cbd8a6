"""TrainerConfig: the validated ``Trainer(...)`` arguments that shape how a stage runs.

Frozen: validated once in ``Trainer(...)`` (:mod:`phalanx.trainer.arguments`), then only read, by
the loops (through the Run) and by callbacks (through ``trainer.max_epochs`` & co.).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

__all__ = ["TrainerConfig"]


@dataclass(frozen=True)
class TrainerConfig:
    """The loop-shaping arguments of ``Trainer(...)``, normalised (see docs/trainer.md for each)."""

    num_nodes: int = 1
    max_epochs: int = 1000
    #: False while ``max_epochs`` was left None: ``trainer.max_epochs`` reads None until ``fit``
    #: settles it (1000, with a warning, or -1 when ``max_steps`` or a Timer bounds the run), as in Lightning.
    max_epochs_set: bool = True
    max_steps: int = -1
    limit_train_batches: int | float = 1.0
    limit_val_batches: int | float = 1.0
    limit_test_batches: int | float = 1.0
    limit_predict_batches: int | float = 1.0
    #: A fraction of the epoch, a number of batches, or a wall-clock time between validations.
    val_check_interval: int | float | timedelta = 1.0
    check_val_every_n_epoch: int | None = 1
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str = "norm"
    log_every_n_steps: int = 50
    use_distributed_sampler: bool = True
    sync_batchnorm: bool = False
    deterministic: bool | str = False
    default_root_dir: str = "."
    min_epochs: int | None = None
    min_steps: int | None = None
    max_time: timedelta | None = None
    num_sanity_val_steps: int | float = 2  # inf: all batches
    #: Batches per loop in a ``fast_dev_run`` (0: off).
    fast_dev_run: int = 0
    overfit_batches: int | float = 0.0
    reload_dataloaders_every_n_epochs: int = 0
    inference_mode: bool = True
    detect_anomaly: bool = False
    benchmark: bool | None = None
    barebones: bool = False
    enable_model_summary: bool = True
    enable_autolog_hparams: bool = True
    #: Seconds without progress before the hang watchdog prints every rank's stack (None: off).
    hang_report_after: float | None = 50.0
