"""RayTrainReportCallback: every checkpoint phalanx writes reaches Ray Train through ``ray.train.report``.

Ray Train restarts a failed worker group from the latest checkpoint reported to it, keeps the
``num_to_keep`` best ones in its storage, and returns the last one in ``Result.checkpoint``. This
callback reports what the Trainer's own checkpointing writes, whatever writes it
(``ModelCheckpoint``, preemption, ``trainer.save_checkpoint`` into the Trainer's checkpoint
folders) and whatever the format (a file, a DCP or DeepSpeed directory, a local path or an fsspec
URL), so the checkpoint Ray resumes from is the one ``ckpt_path="last"`` would pick.

When
    A checkpoint save is a collective: every rank writes it and every rank's callbacks see
    ``on_save_checkpoint``. The callback notes it there (the checkpoint is still being written)
    and reports at the next hook every rank runs (the next batch, validation, epoch boundary, or
    the end of training): ``ray.train.report`` is a barrier that every worker must reach the same
    number of times. Weights-only saves are not reported: they cannot resume a run.

What
    Rank 0 picks the newest complete checkpoint in the Trainer's checkpoint folders (the rule of
    ``ckpt_path="last"``) and, unless it reported that very file already, broadcasts its path. Rank
    0 reports it (with ``epoch``, ``step`` and the logged scalar metrics), the other ranks report no
    checkpoint. Sharded checkpoints must therefore be complete where rank 0 can read them: a shared
    folder, a bucket, or one machine; with node-local disks, point ``ModelCheckpoint(dirpath=...)``
    at an fsspec URL.

Outside a Ray Train worker the callback does nothing (and says so once), so a script with it runs
unchanged without Ray.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Any

from phalanx.callbacks import Callback
from phalanx.checkpoint_io.atomic import COMMIT_MARKER
from phalanx.checkpoint_io.storage import filesystem, is_remote, modified, parent_and_name
from phalanx.trainer.checkpointing import find_last_checkpoint
from phalanx.utilities.rank_zero import rank_zero_warn
from phalanx_ray.checkpoints import require_ray_train, stage_for_report
from phalanx_ray.environment import RayEnvironment

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["RayTrainReportCallback"]


class RayTrainReportCallback(Callback):
    """Report each full checkpoint the Trainer writes to ``ray.train.report``, with the logged metrics.

    Add it to the Trainer built in a ``TorchTrainer`` training function (``callbacks=[
    RayTrainReportCallback()]`` or ``callbacks=["ray_train_report"]``); :func:`phalanx_ray.fit`
    adds it by itself. It keeps no state in checkpoints.
    """

    def __init__(self) -> None:
        self._active = False
        #: A full checkpoint was written since the last report (the same on every rank).
        self._saved = False
        #: Rank 0: (path, version) of the checkpoint reported last, so a save elsewhere does not
        #: report the same checkpoint twice.
        self._reported: tuple[str, Any] | None = None

    def setup(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        self._active = RayEnvironment.detect()
        self._saved = False
        if self._active:
            require_ray_train()
        elif stage == "fit":
            rank_zero_warn(
                "RayTrainReportCallback: this process is not a Ray Train worker, so checkpoints are not reported to "
                "Ray (run the training function with ray.train.torch.TorchTrainer, or phalanx_ray.fit)."
            )

    def on_save_checkpoint(self, trainer: TrainerView, pl_module: Module, checkpoint: dict[str, Any]) -> None:
        self._saved = self._active

    # Every hook below runs on every rank, after any save the previous hooks made (ModelCheckpoint
    # runs after the other callbacks within a hook, so its save is reported at the next one).
    def on_train_batch_start(self, trainer: TrainerView, pl_module: Module, batch: Any, batch_idx: int) -> None:
        self._report(trainer)

    def on_train_batch_end(
        self, trainer: TrainerView, pl_module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._report(trainer)

    def on_validation_start(self, trainer: TrainerView, pl_module: Module) -> None:
        self._report(trainer)

    def on_validation_end(self, trainer: TrainerView, pl_module: Module) -> None:
        self._report(trainer)

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: Module) -> None:
        self._report(trainer)

    def on_train_epoch_end(self, trainer: TrainerView, pl_module: Module) -> None:
        self._report(trainer)

    def on_train_end(self, trainer: TrainerView, pl_module: Module) -> None:
        self._report(trainer)

    def _report(self, trainer: TrainerView) -> None:
        """Report the checkpoint written since the last report, if any: a barrier over all workers."""
        if not self._saved:
            return
        self._saved = False
        newest = self._newest_unreported(trainer) if trainer.is_global_zero else None
        path = trainer.strategy.broadcast(newest)
        if path is None:
            return
        ray_train = require_ray_train()
        metrics = _scalar_metrics(trainer)
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step, checkpoint=parent_and_name(path)[1])
        staging = stage_for_report(path) if trainer.is_global_zero else None
        try:
            checkpoint = ray_train.Checkpoint.from_directory(staging) if staging is not None else None
            ray_train.report(metrics, checkpoint=checkpoint)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)

    def _newest_unreported(self, trainer: TrainerView) -> str | None:
        """Rank 0: the newest checkpoint in the Trainer's folders, or None when it was reported already."""
        path = find_last_checkpoint(trainer)
        if path is None:
            return None
        seen = (path, _version(path))
        if seen == self._reported:
            return None
        self._reported = seen
        return path


def _version(path: str) -> Any:
    """What changes whenever ``path`` is written again (phalanx replaces a checkpoint, never edits it)."""
    if not is_remote(path):
        stat = os.stat(path)  # follows a last.ckpt link to the file it points at
        return (stat.st_ino, stat.st_mtime_ns)
    fs, inner = filesystem(path)
    fs.invalidate_cache()
    marker = f"{inner}/{COMMIT_MARKER}"
    if fs.isdir(inner) and fs.exists(marker):
        return modified(fs, marker)
    return (modified(fs, inner), fs.size(inner) if fs.isfile(inner) else None)


def _scalar_metrics(trainer: TrainerView) -> dict[str, float]:
    """The logged metrics that are single numbers, as floats (Ray refuses tensors in metrics)."""
    metrics: dict[str, float] = {}
    for name, value in trainer.callback_metrics.items():
        if hasattr(value, "numel") and value.numel() == 1:
            metrics[name] = float(value.item())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[name] = float(value)
    return metrics
