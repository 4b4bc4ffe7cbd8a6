"""File names of :class:`~phalanx.callbacks.model_checkpoint.ModelCheckpoint`: Lightning's template rules.

A template such as ``"{epoch}-{val/loss:.2f}"`` becomes ``epoch=3-val/loss=0.12.ckpt``: each
``{name}`` gets ``name=`` in front (``auto_insert_metric_name``), the value is looked up by item
access so names with ``.`` or ``/`` work, and a name that was never logged formats as 0. A name
that is taken by a file the callback does not own gets ``-v1``, ``-v2``... The separators are class
attributes, as in Lightning, so a subclass can change them.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import torch

from phalanx.errors import MisconfigurationError

if TYPE_CHECKING:
    from phalanx.trainer_view import TrainerView

__all__ = ["CheckpointNames"]


class CheckpointNames:
    """Naming for checkpoint callbacks with ``dirpath``, ``filename``, ``auto_insert_metric_name``,
    ``enable_version_counter`` and ``best_k_models`` attributes."""

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    dirpath: str | None
    filename: str | None
    auto_insert_metric_name: bool
    enable_version_counter: bool
    best_k_models: dict[str, Any]  # path -> score (0-d tensors)

    def format_checkpoint_name(
        self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None
    ) -> str:
        """The file path for ``metrics`` (Lightning's template rules; missing metrics format as 0).

        ``"{epoch}-{val_loss:.2f}"`` with epoch 2 and val_loss 0.1234 gives ``epoch=2-val_loss=0.12.ckpt``
        in :attr:`dirpath`; ``ver=1`` appends ``-v1``.
        """
        name = filename or self.filename or "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"
        values = dict(metrics)
        # longest names first, so "{epoch_x}" is not rewritten through "{epoch"
        for group in sorted(set(re.findall(r"(\{.*?)[:}]", name)), key=len, reverse=True):
            key = group[1:]
            if self.auto_insert_metric_name:
                name = name.replace(group, key + self.CHECKPOINT_EQUALS_CHAR + "{" + key)
            name = name.replace(group, "{0[" + key + "]")  # item access: names with "." or "/" work
            values.setdefault(key, 0)
        name = name.format({k: _formattable(v) for k, v in values.items()})
        if ver is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join((name, f"v{ver}"))
        name = f"{name}{self.FILE_EXTENSION}"
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def file_exists(self, filepath: str | os.PathLike[str], trainer: TrainerView) -> bool:
        """Whether ``filepath`` exists on rank 0 (broadcast, so every rank takes the same decision)."""
        return bool(trainer.strategy.broadcast(os.path.exists(filepath)))

    def _unused_path(self, trainer: TrainerView, metrics: dict[str, Any], template: str | None, *, keep: str) -> str:
        """A path that does not clobber files this callback does not own (adds ``-vN``)."""
        path = self.format_checkpoint_name(metrics, template)
        if not self.enable_version_counter:
            return path
        version = self.STARTING_VERSION
        while path != keep and path not in self.best_k_models and self.file_exists(path, trainer):
            path = self.format_checkpoint_name(metrics, template, ver=version)
            version += 1
        return path

    def to_yaml(self, filepath: str | os.PathLike[str] | None = None) -> None:
        """Write :attr:`best_k_models` (path: score) to ``filepath`` (default ``<dirpath>/best_k_models.yaml``)."""
        import fsspec
        import yaml

        if filepath is None:
            if not self.dirpath:
                msg = "ModelCheckpoint.to_yaml() needs a filepath= before fit resolved dirpath; pass filepath='best.yaml'."
                raise MisconfigurationError(msg)
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        with fsspec.open(os.fspath(filepath), "w") as stream:
            yaml.dump({path: float(score) for path, score in self.best_k_models.items()}, stream)


def _formattable(value: Any) -> Any:
    """Numbers as Lightning formats its tensors: ints stay ints (``{epoch:03d}``), the rest floats."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value
