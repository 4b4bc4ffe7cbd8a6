"""The CheckpointIO interface: how checkpoint dicts reach storage and come back.

Strategies build the checkpoint dict (which may involve gathering shards); a CheckpointIO only
moves bytes. Separating the two lets users swap storage (local atomic files, a background thread,
object stores) without touching any strategy.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any

__all__ = ["CheckpointIO", "PathLike"]

PathLike = str | os.PathLike[str]


class CheckpointIO(ABC):
    """Save, load and remove checkpoint files."""

    @abstractmethod
    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: PathLike,
        storage_options: Any | None = None,
    ) -> None:
        """Write ``checkpoint`` to ``path``.

        Args:
            checkpoint: The state to store (model, optimizers, loops, callbacks...).
            path: Where to write it.
            storage_options: Implementation-specific options; implementations that take none
                must reject a non-``None`` value instead of ignoring it.
        """

    @abstractmethod
    def load_checkpoint(
        self,
        path: PathLike,
        map_location: Any | None = None,
        *,
        weights_only: bool = True,
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path``.

        Args:
            path: The file to read.
            map_location: Where tensors are placed, as for ``torch.load``.
            weights_only: Refuse to unpickle arbitrary objects (the safe default). Pass ``False``
                only for checkpoints from a trusted source that contain custom objects.
        """

    @abstractmethod
    def remove_checkpoint(self, path: PathLike) -> None:
        """Delete the checkpoint at ``path``; a missing path is not an error."""

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Finish outstanding work and release resources at the end of a run."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
