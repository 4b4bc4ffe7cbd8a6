"""OnExceptionCheckpoint: save a checkpoint when fit fails, so the work done is not lost.

An exception (a crash, a ``KeyboardInterrupt``, a :class:`~phalanx.callbacks.spike_detection.TrainingSpikeException`)
ends fit wherever it happens; a periodic checkpoint may be hours old. This callback writes the
state at the moment of the failure to ``<dirpath>/<filename>.ckpt``, which ``fit(ckpt_path=...)``
resumes from. A stage that ends normally removes the file, so a stale one is never resumed by
mistake. Lightning's callback, same arguments.

Saving is a collective under parallel strategies: it works when every rank gets the exception
(an exception raised on all ranks, a SIGINT to the job); if one rank fails alone, the others are
not in ``on_exception`` to take part.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from phalanx.callbacks.checkpoint import Checkpoint
from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.module import Module
    from phalanx.trainer_view import TrainerView

__all__ = ["OnExceptionCheckpoint"]


class OnExceptionCheckpoint(Checkpoint):
    """Save ``<dirpath>/<filename>.ckpt`` when the stage raises.

    Args:
        dirpath: Folder of the checkpoint (a path or URL).
        filename: File name without the ``.ckpt`` extension.

    Raises:
        MisconfigurationError: ``filename`` is empty.
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        if not filename:
            msg = "OnExceptionCheckpoint(filename='') is invalid: the filename cannot be empty; pass a name such as 'on_exception'."
            raise MisconfigurationError(msg)
        self.dirpath = dirpath
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        """Where the checkpoint is written."""
        return os.path.join(os.fspath(self.dirpath), self.filename + self.FILE_EXTENSION)

    def on_exception(self, trainer: TrainerView, pl_module: Module, exception: BaseException) -> None:
        """Write the checkpoint (overwriting an older one)."""
        trainer.save_checkpoint(self.ckpt_path)

    def teardown(self, trainer: TrainerView, pl_module: Module, stage: str) -> None:
        """After a stage that ended normally, remove a checkpoint left by an earlier failure."""
        if not trainer.interrupted:  # removing a missing checkpoint is a no-op
            trainer.strategy.remove_checkpoint(self.ckpt_path)

    def state_dict(self) -> dict[str, Any]:
        """Nothing to restore: the path is configuration."""
        return {}
