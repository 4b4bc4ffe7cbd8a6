"""How :class:`~phalanx.callbacks.model_checkpoint.ModelCheckpoint` saves once it has decided to:
the top-k ranking, ``last``, writing, and removing the file a save replaced.

Every rank runs these with the same values (the scores are rank 0's, broadcast), because saving
is a collective; only rank 0's file checks decide, and they are broadcast too.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from phalanx.callbacks._checkpoint_names import CheckpointNames
from phalanx.checkpoint_io.storage import filesystem, is_remote, remote_error
from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["CheckpointSaving"]


class CheckpointSaving(CheckpointNames):
    """Top-k and ``last`` saving for a checkpoint callback with ModelCheckpoint's attributes."""

    monitor: str | None
    mode: str
    save_top_k: int
    save_last: bool | str | None
    _last_checkpoint_saved: str
    save_weights_only: bool
    verbose: bool
    kth_best_model_path: str
    kth_value: torch.Tensor
    best_model_path: str
    best_model_score: torch.Tensor | None
    current_score: torch.Tensor | None
    last_model_path: str
    _last_global_step_saved: int

    def check_monitor_top_k(self, trainer: TrainerView, current: float | None = None) -> bool:
        """Whether ``current`` enters the top k (the same answer on every rank: scores are rank 0's)."""
        if current is None:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        return bool(current < self.kth_value if self.mode == "min" else current > self.kth_value)

    def _save_topk(self, trainer: TrainerView, candidates: dict[str, Any]) -> None:
        if self.save_top_k == 0:
            return
        if self.monitor is None:
            previous = self.best_model_path
            path = self._unused_path(trainer, candidates, None, keep=previous)
            self.best_model_path = path
            self._write(trainer, path)
            if self.save_top_k == 1 and previous and self._should_remove(trainer, previous, path):
                trainer.strategy.remove_checkpoint(previous)
            return
        if self.monitor not in candidates:
            available = sorted(k for k in candidates if k not in ("epoch", "step"))
            msg = (
                f"ModelCheckpoint(monitor={self.monitor!r}) found no metric {self.monitor!r}; logged metrics "
                f"are {available}. Fix: log it with self.log({self.monitor!r}, value) (in validation_step for a "
                "validation metric), or correct the monitor name."
            )
            if trainer.validation_has_run or not trainer.validation_enabled:
                raise MisconfigurationError(msg)
            rank_zero_warn(msg + " Skipping this save until the metric exists.")
            return
        current = float(candidates[self.monitor])
        if math.isnan(current):
            current = math.inf if self.mode == "min" else -math.inf
        if self.check_monitor_top_k(trainer, current):
            self._update_best_and_save(trainer, current, candidates)
        elif self.verbose:
            rank_zero_info(
                f"Epoch {candidates['epoch']:d}, global step {candidates['step']:d}: {self.monitor!r} was not in "
                f"top {self.save_top_k}"
            )

    def _update_best_and_save(self, trainer: TrainerView, current: float, candidates: dict[str, Any]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        removed = ""
        if len(self.best_k_models) == k and k > 0:
            removed = self.kth_best_model_path
            self.best_k_models.pop(removed, None)
        path = self._unused_path(trainer, candidates, None, keep=removed)
        self.current_score = torch.tensor(current)
        self.best_k_models[path] = self.current_score
        worst, best = (max, min) if self.mode == "min" else (min, max)
        if len(self.best_k_models) == k:
            self.kth_best_model_path = worst(self.best_k_models, key=lambda p: float(self.best_k_models[p]))
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        self.best_model_path = best(self.best_k_models, key=lambda p: float(self.best_k_models[p]))
        self.best_model_score = self.best_k_models[self.best_model_path]
        if self.verbose:
            rank_zero_info(
                f"Epoch {candidates['epoch']:d}, global step {candidates['step']:d}: {self.monitor!r} reached "
                f"{current:0.5f} (best {self.best_model_score:0.5f}), saving model to {path!r} as top {k}"
            )
        self._write(trainer, path)
        if removed and self._should_remove(trainer, removed, path):
            trainer.strategy.remove_checkpoint(removed)

    def _save_last(self, trainer: TrainerView, candidates: dict[str, Any]) -> None:
        path = self._unused_path(trainer, candidates, self.CHECKPOINT_NAME_LAST, keep=self.last_model_path)
        previous, self.last_model_path = self.last_model_path, path
        if self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0:
            self._link(trainer, self._last_checkpoint_saved, path)
        else:
            self._write(trainer, path)
        if (
            previous
            and previous not in self.best_k_models
            and previous != self.best_model_path
            and self._should_remove(trainer, previous, path)
        ):
            trainer.strategy.remove_checkpoint(previous)

    @staticmethod
    def _link(trainer: TrainerView, target: str, link: str) -> None:
        """Point ``link`` at ``target`` (relative, so the folder can move), replacing what was there.

        The link is made under a temporary name and renamed over ``link``, so a reader never finds
        ``last.ckpt`` missing; where links are not allowed, a copy is written the same way.
        """
        if trainer.is_global_zero and os.path.abspath(target) != os.path.abspath(link):
            staging = os.path.join(os.path.dirname(link) or ".", f".{os.path.basename(link)}.link-tmp")
            if os.path.lexists(staging):
                os.remove(staging)
            try:
                os.symlink(os.path.relpath(target, os.path.dirname(link) or "."), staging)
            except OSError:  # e.g. Windows without the privilege to create links
                shutil.copy(target, staging)
            if os.path.isdir(link) and not os.path.islink(link):
                shutil.rmtree(link)  # a sharded checkpoint directory that was here
            os.replace(staging, link)
        trainer.strategy.barrier()

    def _write(self, trainer: TrainerView, path: str) -> None:
        trainer.save_checkpoint(path, weights_only=self.save_weights_only)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = path
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(self)
        if self.verbose and self.monitor is None:
            rank_zero_info(f"Epoch {trainer.current_epoch}, global step {trainer.global_step}: saved {path}")

    def file_exists(self, filepath: str | os.PathLike[str], trainer: TrainerView) -> bool:
        """Whether ``filepath`` exists on rank 0 (a file, or a directory on a store), broadcast to every rank."""
        text = os.fspath(filepath)
        if not is_remote(text):
            return bool(trainer.strategy.broadcast(os.path.exists(text)))
        exists: bool | str = False
        if trainer.is_global_zero:
            try:
                fs, inner = filesystem(text)
                fs.invalidate_cache()
                exists = bool(fs.exists(inner))
            except Exception as error:  # the store's own errors (endpoint, credentials) vary by backend
                exists = remote_error(text, error, action="look up the checkpoint")
        exists = trainer.strategy.broadcast(exists)
        if isinstance(exists, str):  # every rank raises alike
            raise CheckpointError(exists)
        return exists

    def _should_remove(self, trainer: TrainerView, previous: str, current: str) -> bool:
        """Never delete the file just written, the checkpoint fit resumed from, or one outside ``dirpath``."""
        if previous == current:
            return False
        resumed = trainer.ckpt_path
        if is_remote(previous):
            if resumed is not None and os.fspath(resumed).rstrip("/") == previous.rstrip("/"):
                return False
            return bool(self.dirpath) and previous.startswith(str(self.dirpath).rstrip("/") + "/")
        if resumed is not None and not is_remote(resumed) and Path(previous).absolute() == Path(resumed).absolute():
            return False
        return Path(self.dirpath or ".").absolute() in Path(previous).absolute().parents
