"""ModelCheckpoint: save checkpoints periodically, keep the best k by a metric, and ``last``.

Saving is a collective (sharded strategies gather state), so every rank runs the same decisions:
they depend only on values all ranks share (step, epoch, and rank 0's metrics, broadcast), and
the file checks rank 0 makes are broadcast. The callback's own state (best scores, paths) goes into each
checkpoint, so a resumed run keeps pruning the same top-k set instead of starting over.

Three triggers, mutually exclusive as in Lightning: every N epochs (the default, 1), every N
optimizer steps, or every ``train_time_interval`` of wall time (rank 0's clock decides, broadcast,
so every rank saves at the same batch). A step or time trigger whose monitored metric comes from
validation waits for that validation (Lightning 2.6): when the metric was never logged yet, or when
a validation runs right after this batch, the save happens at the validation's end instead, with
fresh values rather than stale ones.
"""

from __future__ import annotations

import math
import os
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import torch

from phalanx.callbacks._checkpoint_saving import CheckpointSaving
from phalanx.callbacks.checkpoint import Checkpoint
from phalanx.checkpoint_io.storage import is_remote
from phalanx.errors import MisconfigurationError
from phalanx.utilities.paths import check_path
from phalanx.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["ModelCheckpoint"]

_MODES = ("min", "max")


def _opt_int(name: str, value: Any, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        msg = f"ModelCheckpoint({name}={value!r}) is invalid; pass an int >= {minimum} or None."
        raise MisconfigurationError(msg)
    return value


def _score(value: Any) -> torch.Tensor | None:
    """A stored score as a 0-d tensor (checkpoints of earlier releases hold floats)."""
    return None if value is None else torch.as_tensor(value)


class ModelCheckpoint(CheckpointSaving, Checkpoint):
    """Save checkpoints during fit.

    Args:
        dirpath: Directory for the files; default ``<log_dir>/checkpoints`` (or
            ``<default_root_dir>/checkpoints`` without a logger).
        filename: Template such as ``"{epoch}-{val_loss:.2f}"``; default ``"{epoch}-{step}"``.
            ``{name}`` becomes ``name=value`` (unless ``auto_insert_metric_name=False``); a name
            may contain ``/`` or ``.`` (``"{val/loss:.2f}"``); one that was not logged formats as 0.
        monitor: Metric in ``trainer.callback_metrics`` ranking the checkpoints; None keeps the latest.
        mode: ``"min"`` or ``"max"``: which direction of ``monitor`` is better.
        save_top_k: Keep the best k (``-1`` all, ``0`` none except ``last``).
        save_last: Also keep ``last.ckpt``, always the newest state (also written when fit ends).
            ``"link"``: make ``last.ckpt`` a symbolic link to the newest checkpoint written instead
            of a second copy (local paths only; a copy where links are not allowed).
        every_n_train_steps: Save every N optimizer steps (0/None: off).
        train_time_interval: Save when this much wall time (a ``timedelta``) passed since the last
            time-triggered save; checked after each training batch.
        every_n_epochs: Save every N epochs (default 1 when no other trigger is given; 0: off).
        save_weights_only: Store only the weights (such files cannot resume training).
        save_on_train_epoch_end: Force saving at train-epoch end (True) or after validation (False);
            None decides like Lightning.
        auto_insert_metric_name: Write ``name=value`` for each ``{name}`` in the template.
        verbose: Report every save and every score that did not make the top k (rank 0).
        enable_version_counter: On a name collision with a file this callback does not own, write
            ``name-v1.ckpt``, ``name-v2.ckpt``... (False: overwrite it).

    Attributes:
        best_model_path: The best checkpoint so far (the latest one without ``monitor``).
        best_model_score: Its score (a 0-d tensor, as Lightning's; None before the first ranked save).
        best_k_models: Path -> score of the kept top-k checkpoints.
        kth_best_model_path: The worst of the kept top k (the next to go).
        last_model_path: The ``last`` checkpoint.

    Raises:
        MisconfigurationError: Any invalid option (the message says which and how to fix it); at
            the first check after validation (or without validation), a ``monitor`` that was never
            logged, raised on every rank alike.
    """

    #: Runs after the other callbacks at epoch end, when epoch metrics are final.
    monitors_metrics = True

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        filename: str | None = None,
        monitor: str | None = None,
        mode: str = "min",
        save_top_k: int = 1,
        save_last: bool | Literal["link"] | None = None,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        every_n_epochs: int | None = None,
        save_weights_only: bool = False,
        save_on_train_epoch_end: bool | None = None,
        auto_insert_metric_name: bool = True,
        verbose: bool = False,
        enable_version_counter: bool = True,
    ) -> None:
        if dirpath is not None and not isinstance(dirpath, (str, os.PathLike)):
            msg = f"ModelCheckpoint(dirpath={dirpath!r}) must be a path (str or os.PathLike) or None."
            raise MisconfigurationError(msg)
        for name, value in (("filename", filename), ("monitor", monitor)):
            if value is not None and not isinstance(value, str):
                msg = f"ModelCheckpoint({name}={value!r}) must be a string or None."
                raise MisconfigurationError(msg)
        if mode not in _MODES:
            msg = f"ModelCheckpoint(mode={mode!r}) is invalid; valid values are {list(_MODES)}. Fix: pass mode='min' or mode='max'."
            raise MisconfigurationError(msg)
        top_k = _opt_int("save_top_k", save_top_k, -1)
        if monitor is None and top_k not in (-1, 0, 1):
            msg = (
                f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) cannot rank checkpoints without a "
                "metric; pass monitor='val_loss' (a name you self.log), or save_top_k in (-1, 0, 1)."
            )
            raise MisconfigurationError(msg)
        if train_time_interval is not None and not isinstance(train_time_interval, timedelta):
            msg = (
                f"ModelCheckpoint(train_time_interval={train_time_interval!r}) must be a datetime.timedelta or None; "
                "pass e.g. train_time_interval=timedelta(minutes=30)."
            )
            raise MisconfigurationError(msg)
        steps = _opt_int("every_n_train_steps", every_n_train_steps, 0) or 0
        epochs = _opt_int("every_n_epochs", every_n_epochs, 0)
        if (steps > 0) + bool(epochs) + (train_time_interval is not None) > 1:
            msg = (
                f"ModelCheckpoint(every_n_train_steps={steps}, every_n_epochs={epochs}, train_time_interval="
                f"{train_time_interval}) sets several triggers; they are mutually exclusive. Keep one of them "
                "(use two ModelCheckpoint callbacks for two schedules)."
            )
            raise MisconfigurationError(msg)
        if save_last is not None and not isinstance(save_last, bool) and save_last != "link":
            msg = f"ModelCheckpoint(save_last={save_last!r}) must be True, False, None or 'link'."
            raise MisconfigurationError(msg)
        if save_on_train_epoch_end is not None and not isinstance(save_on_train_epoch_end, bool):
            msg = f"ModelCheckpoint(save_on_train_epoch_end={save_on_train_epoch_end!r}) must be True, False or None."
            raise MisconfigurationError(msg)
        self.dirpath: str | None = (
            check_path(dirpath, argument="ModelCheckpoint(dirpath=...)") if dirpath is not None else None
        )
        self._user_dirpath = self.dirpath is not None
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = top_k if top_k is not None else 1
        self.save_last = save_last
        self.every_n_train_steps = steps
        self.train_time_interval = train_time_interval
        no_trigger = steps == 0 and epochs is None and train_time_interval is None
        self.every_n_epochs = 1 if no_trigger else (epochs or 0)
        self.save_weights_only = bool(save_weights_only)
        self._save_on_train_epoch_end = save_on_train_epoch_end
        self.auto_insert_metric_name = auto_insert_metric_name
        self.verbose = verbose
        self.enable_version_counter = enable_version_counter
        # Scores are 0-d tensors, as Lightning's (``best_model_score.item()`` works as users write it).
        self.best_k_models: dict[str, torch.Tensor] = {}
        self.kth_best_model_path = ""
        self.kth_value: torch.Tensor = torch.tensor(math.inf if mode == "min" else -math.inf)
        self.best_model_path = ""
        self.best_model_score: torch.Tensor | None = None
        self.current_score: torch.Tensor | None = None
        self.last_model_path = ""
        self._last_global_step_saved = -1
        self._last_checkpoint_saved = ""  # the newest file written, which save_last="link" points at
        self._last_time_checked: float | None = None
        self._defer_save_until_validation = False

    @property
    def state_key(self) -> str:
        """Unique per configuration, so several ModelCheckpoints restore their own state."""
        return self._generate_state_key(
            monitor=self.monitor,
            mode=self.mode,
            every_n_train_steps=self.every_n_train_steps,
            every_n_epochs=self.every_n_epochs,
            train_time_interval=self.train_time_interval,
        )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Best paths and scores, so a resumed run keeps managing the same files."""
        return {
            "monitor": self.monitor,
            "dirpath": self.dirpath,
            "best_model_score": self.best_model_score,
            "best_model_path": self.best_model_path,
            "current_score": self.current_score,
            "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "last_model_path": self.last_model_path,
            "last_global_step_saved": self._last_global_step_saved,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the top-k bookkeeping when the directory is the same; else only the best path."""
        if state_dict.get("dirpath") == self.dirpath:
            self.best_model_score = _score(state_dict.get("best_model_score"))
            self.current_score = _score(state_dict.get("current_score"))
            self.best_k_models = {p: torch.as_tensor(v) for p, v in state_dict.get("best_k_models", {}).items()}
            self.kth_best_model_path = state_dict.get("kth_best_model_path", "")
            self.kth_value = torch.as_tensor(state_dict.get("kth_value", self.kth_value))
            self.last_model_path = state_dict.get("last_model_path", "")
            self._last_global_step_saved = state_dict.get("last_global_step_saved", -1)
        else:
            rank_zero_warn(
                f"ModelCheckpoint: the dirpath changed from {state_dict.get('dirpath')!r} to {self.dirpath!r}, so "
                "best_model_score, kth_best_model_path, kth_value, last_model_path and best_k_models are not "
                "restored; only best_model_path is."
            )
        self.best_model_path = state_dict.get("best_model_path", "")

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Resolve the directory on rank 0 and share it, so every rank names files identically."""
        if not self._user_dirpath:
            self.dirpath = trainer.default_checkpoint_dir
        self.dirpath = trainer.strategy.broadcast(self.dirpath)
        if self.save_last == "link" and self.dirpath is not None and is_remote(self.dirpath):
            msg = (
                f"ModelCheckpoint(save_last='link') needs a local dirpath, got dirpath={self.dirpath!r}: an object "
                "store has no links. Use save_last=True there."
            )
            raise ValueError(msg)

    def on_train_start(self, trainer: TrainerView, pl_module: Module) -> None:
        """Start the clock of ``train_time_interval``."""
        self._last_time_checked = time.monotonic()

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Save every ``every_n_train_steps`` optimizer steps or ``train_time_interval`` (or defer to validation)."""
        if self._should_skip(trainer):
            return
        n = self.every_n_train_steps
        skip_batch = n < 1 or trainer.global_step % n != 0
        skip_time = True
        now = time.monotonic()
        if self.train_time_interval is not None:
            previous = self._last_time_checked
            skip_time = previous is None or now - previous < self.train_time_interval.total_seconds()
            skip_time = bool(trainer.strategy.broadcast(skip_time))  # rank 0's clock decides for every rank
        if skip_batch and skip_time:
            return
        if not skip_time:
            self._last_time_checked = now
        candidates = self._candidates(trainer)
        if self._defers_to_validation(trainer, candidates):
            self._defer_save_until_validation = True
            return
        self._save(trainer, candidates)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Save at epoch end when validation does not run more often than once per epoch."""
        if self._should_skip(trainer) or not self._save_on_epoch_end(trainer):
            return
        candidates = self._candidates(trainer)
        if self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._save_topk(trainer, candidates)
        self._finish_save(trainer, candidates)

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Save after validation: a deferred step/time save, or the epoch save when validation runs mid-epoch."""
        if self._should_skip(trainer):
            return
        if self._defer_save_until_validation:
            self._defer_save_until_validation = False
            self._save(trainer, self._candidates(trainer))
            return
        if self._save_on_epoch_end(trainer):
            return
        candidates = self._candidates(trainer)
        if self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._save_topk(trainer, candidates)
        self._finish_save(trainer, candidates)

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Write ``last`` for the final state if the last save was earlier (e.g. max_steps mid-epoch)."""
        if self.save_last and self._last_global_step_saved != trainer.global_step and trainer.state.fn == "fit":
            self._save_last(trainer, self._candidates(trainer))

    # ------------------------------------------------------------------ decisions
    def _should_skip(self, trainer: TrainerView) -> bool:
        return (
            trainer.state.fn != "fit"
            or trainer.sanity_checking
            or bool(trainer.fast_dev_run)
            or self._last_global_step_saved == trainer.global_step
        )

    def _save_on_epoch_end(self, trainer: TrainerView) -> bool:
        if self._save_on_train_epoch_end is not None:
            return self._save_on_train_epoch_end
        if trainer.check_val_every_n_epoch != 1:
            return False
        if sum(trainer.num_val_batches) == 0:
            return True
        return trainer.val_check_interval == 1.0

    def _defers_to_validation(self, trainer: TrainerView, candidates: dict[str, Any]) -> bool:
        """Whether a step/time save should wait for validation's metrics (Lightning 2.6).

        Only for a ``monitor`` that is not there yet (a validation-only metric before the first
        validation), or when a validation runs right after this last batch of the epoch (the value
        now would be the previous validation's).
        """
        if self.monitor is None or not trainer.validation_enabled:
            return False
        if self.monitor not in candidates:
            return True
        if self._save_on_epoch_end(trainer) or not trainer.is_last_batch:
            return False
        every = trainer.check_val_every_n_epoch
        return every is None or (trainer.current_epoch + 1) % every == 0

    def _candidates(self, trainer: TrainerView) -> dict[str, Any]:
        """The metrics names and rankings come from, as rank 0 has them.

        Metrics logged without ``sync_dist`` differ between ranks; if each rank ranked its own
        value, ranks would disagree on the top-k and on which file to delete. Rank 0 writes the
        files, so its values decide, and every rank receives them (one broadcast per save). The
        same broadcast makes a missing ``monitor`` missing on every rank, so all raise alike.
        """
        metrics: dict[str, Any] = {
            key: float(value.detach().float().cpu())
            if isinstance(value, torch.Tensor) and value.numel() == 1
            else value
            for key, value in trainer.callback_metrics.items()
        }
        metrics = trainer.strategy.broadcast(metrics)
        metrics["epoch"] = int(metrics["epoch"]) if isinstance(metrics.get("epoch"), float) else trainer.current_epoch
        metrics["step"] = int(metrics["step"]) if isinstance(metrics.get("step"), float) else trainer.global_step
        return metrics

    def _save(self, trainer: TrainerView, candidates: dict[str, Any]) -> None:
        self._save_topk(trainer, candidates)
        self._finish_save(trainer, candidates)

    def _finish_save(self, trainer: TrainerView, candidates: dict[str, Any]) -> None:
        if self.save_last:
            self._save_last(trainer, candidates)
