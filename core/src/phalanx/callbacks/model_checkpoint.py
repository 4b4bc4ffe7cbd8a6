"""ModelCheckpoint: save checkpoints periodically, keep the best k by a metric, and ``last``.

Saving is a collective (sharded strategies gather state), so every rank runs the same decisions:
they depend only on values all ranks share (step, epoch, and rank 0's metrics, broadcast), and
the file checks rank 0 makes are broadcast. The callback's own state (best scores, paths) goes into each
checkpoint, so a resumed run keeps pruning the same top-k set instead of starting over.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from phalanx.callbacks.callback import Callback
from phalanx.errors import MisconfigurationError

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


class ModelCheckpoint(Callback):
    """Save checkpoints during fit.

    Args:
        dirpath: Directory for the files; default ``<log_dir>/checkpoints`` (or
            ``<default_root_dir>/checkpoints`` without a logger).
        filename: Template such as ``"{epoch}-{val_loss:.2f}"``; default ``"{epoch}-{step}"``.
            ``{name}`` becomes ``name=value`` (unless ``auto_insert_metric_name=False``).
        monitor: Metric in ``trainer.callback_metrics`` ranking the checkpoints; None keeps the latest.
        mode: ``"min"`` or ``"max"``: which direction of ``monitor`` is better.
        save_top_k: Keep the best k (``-1`` all, ``0`` none except ``last``).
        save_last: Also keep ``last.ckpt``, always the newest state (also written when fit ends).
        every_n_train_steps: Save every N optimizer steps (0/None: off).
        every_n_epochs: Save every N epochs (default 1 when no step interval is given).
        save_weights_only: Store only the weights (such files cannot resume training).
        save_on_train_epoch_end: Force saving at train-epoch end (True) or after validation (False);
            None decides like Lightning.
        auto_insert_metric_name: Write ``name=value`` for each ``{name}`` in the template.
        verbose: Print a line for every save.

    Raises:
        MisconfigurationError: Any invalid option (the message says which and how to fix it).
    """

    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
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
        save_last: bool | None = None,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
        save_weights_only: bool = False,
        save_on_train_epoch_end: bool | None = None,
        auto_insert_metric_name: bool = True,
        verbose: bool = False,
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
        steps = _opt_int("every_n_train_steps", every_n_train_steps, 0) or 0
        epochs = _opt_int("every_n_epochs", every_n_epochs, 0)
        if steps > 0 and epochs:
            msg = (
                f"ModelCheckpoint(every_n_train_steps={steps}, every_n_epochs={epochs}) sets two "
                "intervals; they are mutually exclusive. Keep one of them."
            )
            raise MisconfigurationError(msg)
        for name, flag in (("save_last", save_last), ("save_on_train_epoch_end", save_on_train_epoch_end)):
            if flag is not None and not isinstance(flag, bool):
                msg = f"ModelCheckpoint({name}={flag!r}) must be True, False or None."
                raise MisconfigurationError(msg)
        self.dirpath: str | None = os.fspath(dirpath) if dirpath is not None else None
        self._user_dirpath = self.dirpath is not None
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = top_k if top_k is not None else 1
        self.save_last = save_last
        self.every_n_train_steps = steps
        self.every_n_epochs = epochs if epochs is not None else (0 if steps > 0 else 1)
        self.save_weights_only = bool(save_weights_only)
        self._save_on_train_epoch_end = save_on_train_epoch_end
        self.auto_insert_metric_name = auto_insert_metric_name
        self.verbose = verbose
        self.best_k_models: dict[str, float] = {}
        self.kth_best_model_path = ""
        self.kth_value: float = math.inf if mode == "min" else -math.inf
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.current_score: float | None = None
        self.last_model_path = ""
        self._last_global_step_saved = -1

    @property
    def state_key(self) -> str:
        """Unique per configuration, so several ModelCheckpoints restore their own state."""
        return self._generate_state_key(
            monitor=self.monitor,
            mode=self.mode,
            every_n_train_steps=self.every_n_train_steps,
            every_n_epochs=self.every_n_epochs,
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
            self.best_model_score = state_dict.get("best_model_score")
            self.current_score = state_dict.get("current_score")
            self.best_k_models = dict(state_dict.get("best_k_models", {}))
            self.kth_best_model_path = state_dict.get("kth_best_model_path", "")
            self.kth_value = state_dict.get("kth_value", self.kth_value)
            self.last_model_path = state_dict.get("last_model_path", "")
            self._last_global_step_saved = state_dict.get("last_global_step_saved", -1)
        self.best_model_path = state_dict.get("best_model_path", "")

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """Resolve the directory on rank 0 and share it, so every rank names files identically."""
        if not self._user_dirpath:
            self.dirpath = trainer.default_checkpoint_dir
        self.dirpath = trainer.strategy.broadcast(self.dirpath)

    def on_train_batch_end(self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Save every ``every_n_train_steps`` optimizer steps."""
        n = self.every_n_train_steps
        if n < 1 or trainer.global_step % n != 0 or self._should_skip(trainer):
            return
        self._save(trainer)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Save at epoch end when validation does not run more often than once per epoch."""
        if self._should_skip(trainer) or not self._save_on_epoch_end(trainer):
            return
        if self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._save(trainer)

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Save after validation when validation runs mid-epoch or not every epoch."""
        if self._should_skip(trainer) or self._save_on_epoch_end(trainer) or self.every_n_train_steps > 0:
            return
        if self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._save(trainer)

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        """Write ``last`` for the final state if the last save was earlier (e.g. max_steps mid-epoch)."""
        if self.save_last and self._last_global_step_saved != trainer.global_step:
            self._save_last(trainer, self._candidates(trainer))
            self._last_global_step_saved = trainer.global_step

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

    def _candidates(self, trainer: TrainerView) -> dict[str, Any]:
        """The metrics names and rankings come from, as rank 0 has them.

        Metrics logged without ``sync_dist`` differ between ranks; if each rank ranked its own
        value, ranks would disagree on the top-k and on which file to delete. Rank 0 writes the
        files, so its values decide, and every rank receives them (one broadcast per save).
        """
        metrics: dict[str, Any] = {
            key: float(value.detach().float().cpu()) if isinstance(value, torch.Tensor) and value.numel() == 1 else value
            for key, value in trainer.callback_metrics.items()
        }
        metrics = trainer.strategy.broadcast(metrics)
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        return metrics

    def _save(self, trainer: TrainerView) -> None:
        candidates = self._candidates(trainer)
        self._save_topk(trainer, candidates)
        if self.save_last:
            self._save_last(trainer, candidates)
        self._last_global_step_saved = trainer.global_step

    def _save_topk(self, trainer: TrainerView, candidates: dict[str, Any]) -> None:
        if self.save_top_k == 0:
            return
        if self.monitor is None:
            previous = self.best_model_path
            path = self._unused_path(trainer, candidates, None, keep=previous)
            self._write(trainer, path)
            self.best_model_path = path
            if self.save_top_k == 1 and previous and previous != path:
                trainer.strategy.remove_checkpoint(previous)
            return
        if self.monitor not in candidates:
            available = sorted(k for k in candidates if k not in ("epoch", "step"))
            msg = (
                f"ModelCheckpoint(monitor={self.monitor!r}) found no metric {self.monitor!r}; logged metrics "
                f"are {available}. Log it with self.log({self.monitor!r}, value), or fix the monitor name."
            )
            if trainer.validation_has_run or not trainer.validation_enabled:
                raise MisconfigurationError(msg)
            warnings.warn(msg + " Skipping this save until the metric exists.", stacklevel=2)
            return
        current = float(candidates[self.monitor])
        if math.isnan(current):
            current = math.inf if self.mode == "min" else -math.inf
        self.current_score = current
        if self._improves_top_k(current):
            self._update_best_and_save(trainer, current, candidates)

    def _improves_top_k(self, current: float) -> bool:
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        return current < self.kth_value if self.mode == "min" else current > self.kth_value

    def _update_best_and_save(self, trainer: TrainerView, current: float, candidates: dict[str, Any]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        removed = ""
        if len(self.best_k_models) == k and k > 0:
            removed = self.kth_best_model_path
            self.best_k_models.pop(removed, None)
        path = self._unused_path(trainer, candidates, None, keep=removed)
        self.best_k_models[path] = current
        worst, best = (max, min) if self.mode == "min" else (min, max)
        if len(self.best_k_models) == k:
            self.kth_best_model_path = worst(self.best_k_models, key=self.best_k_models.__getitem__)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        self.best_model_path = best(self.best_k_models, key=self.best_k_models.__getitem__)
        self.best_model_score = self.best_k_models[self.best_model_path]
        self._write(trainer, path)
        if removed and removed != path:
            trainer.strategy.remove_checkpoint(removed)

    def _save_last(self, trainer: TrainerView, candidates: dict[str, Any]) -> None:
        path = self._unused_path(trainer, candidates, self.CHECKPOINT_NAME_LAST, keep=self.last_model_path)
        self._write(trainer, path)
        previous, self.last_model_path = self.last_model_path, path
        if previous and previous != path and previous not in self.best_k_models and previous != self.best_model_path:
            trainer.strategy.remove_checkpoint(previous)

    def _write(self, trainer: TrainerView, path: str) -> None:
        trainer.save_checkpoint(path, weights_only=self.save_weights_only)
        if self.verbose and trainer.is_global_zero:
            print(f"Epoch {trainer.current_epoch}, global step {trainer.global_step}: saved {path}")

    # ------------------------------------------------------------------ names
    def format_checkpoint_name(
        self, metrics: dict[str, Any], template: str | None = None, ver: int | None = None
    ) -> str:
        """The file name (with directory) for ``metrics``; missing metrics format as 0."""
        name = template if template is not None else (self.filename or "{epoch}-{step}")
        for group in re.findall(r"\{([^{}:!]+)[^{}]*\}", name):
            key = group.strip()
            prefix = f"{key}=" if self.auto_insert_metric_name else ""
            name = name.replace("{" + group, prefix + "{0[" + key + "]", 1)
            value = metrics.get(key, 0)
            metrics = {**metrics, key: float(value) if key not in ("epoch", "step") else int(value)}
        name = name.format(metrics)
        if ver is not None:
            name = f"{name}-v{ver}"
        return str(Path(self.dirpath or ".") / f"{name}{self.FILE_EXTENSION}")

    def _unused_path(self, trainer: TrainerView, metrics: dict[str, Any], template: str | None, *, keep: str) -> str:
        """A path that does not clobber files this callback does not own (adds ``-vN``)."""
        path = self.format_checkpoint_name(metrics, template)
        version = 1
        while path != keep and path not in self.best_k_models and trainer.strategy.broadcast(os.path.exists(path)):
            path = self.format_checkpoint_name(metrics, template, ver=version)
            version += 1
        return path
