"""The ``log_model`` policy the artifact loggers share (MLflow, W&B): which checkpoint files go up, when.

``log_model=True`` uploads a checkpoint callback's files when the stage ends (after each save
instead when ``save_top_k=-1`` keeps every file), ``"all"`` after each save, ``False`` never. A file
goes up again when it was rewritten since its last upload (``last.ckpt`` keeps its name). Each
upload carries the score, the file name and the callback's settings; the logger says how one file
goes up (:meth:`CheckpointUploads._upload_checkpoint`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from phalanx.loggers._params import scan_checkpoints


class CheckpointUploads:
    """Mixin of a logger with ``log_model``: set ``_log_model``, ``_logged_model_time = {}`` and
    ``_checkpoint_callbacks = {}`` in ``__init__``, call :meth:`_upload_pending_checkpoints` from
    ``finalize``, and implement :meth:`_upload_checkpoint`."""

    #: The checkpoint callback's settings recorded with each upload (those it has).
    checkpoint_setting_names: tuple[str, ...] = (
        "monitor",
        "mode",
        "save_last",
        "save_top_k",
        "save_weights_only",
        "every_n_train_steps",
    )
    #: The metadata key the settings go under; None: the callback's class name.
    checkpoint_settings_key: str | None = None

    _log_model: bool | Literal["all"]
    _logged_model_time: dict[str, float]
    _checkpoint_callbacks: dict[int, Any]

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Upload the callback's new files now (``"all"``, or True with ``save_top_k=-1``), or remember it for the end."""
        if self._log_model == "all" or (self._log_model is True and checkpoint_callback.save_top_k == -1):
            self._upload_new_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callbacks[id(checkpoint_callback)] = checkpoint_callback

    def _upload_pending_checkpoints(self) -> None:
        """At the end of a stage: the new files of every callback remembered by :meth:`after_save_checkpoint`."""
        for callback in self._checkpoint_callbacks.values():
            self._upload_new_checkpoints(callback)
        self._checkpoint_callbacks = {}

    def _upload_new_checkpoints(self, checkpoint_callback: Any) -> None:
        for mtime, path, score, _tag in scan_checkpoints(checkpoint_callback, self._logged_model_time):
            settings = {
                name: getattr(checkpoint_callback, name)
                for name in self.checkpoint_setting_names
                if hasattr(checkpoint_callback, name)
            }
            metadata = {
                "score": score.item() if hasattr(score, "item") else score,
                "original_filename": Path(path).name,
                self.checkpoint_settings_key or type(checkpoint_callback).__name__: settings,
            }
            aliases = ["latest", "best"] if path == checkpoint_callback.best_model_path else ["latest"]
            self._upload_checkpoint(path, metadata, aliases)
            self._logged_model_time[path] = mtime

    def _upload_checkpoint(self, path: str, metadata: dict[str, Any], aliases: list[str]) -> None:
        """Send one checkpoint file with its metadata and aliases (``["latest"]``, plus ``"best"``)."""
        raise NotImplementedError
