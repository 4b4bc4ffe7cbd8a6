"""Checkpoint IOs with one real bug each; the checkpoint IO kit must fail every one of them."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch

from phalanx.checkpoint_io import TorchCheckpointIO
from phalanx.checkpoint_io.async_io import AsyncCheckpointIO
from phalanx.utilities.apply_func import apply_to_collection


class InPlaceIO(TorchCheckpointIO):
    """Writes straight over the target: killed mid-save, neither the old nor the new checkpoint remains."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(checkpoint, path)


class BufferedInPlaceIO(TorchCheckpointIO):
    """Serialises into memory first (so a kill while pickling is harmless), then overwrites in place."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        import io

        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(buffer.getvalue())


class Float32IO(TorchCheckpointIO):
    """Stores every floating tensor as float32 "for portability": bf16 comes back as another dtype."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        def widen(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.float() if tensor.is_floating_point() else tensor

        super().save_checkpoint(apply_to_collection(checkpoint, torch.Tensor, widen), path, storage_options)


class NoSnapshotAsyncIO(AsyncCheckpointIO):
    """Queues the caller's live tensors: training on in place changes what gets written."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self._submit(self.checkpoint_io.save_checkpoint, checkpoint, path, storage_options=storage_options)


class DroppingAsyncIO(AsyncCheckpointIO):
    """Stops its thread at teardown without waiting: the saves still queued are lost."""

    def teardown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class KeepingIO(TorchCheckpointIO):
    """Never deletes anything: old checkpoints pile up on the disk."""

    def remove_checkpoint(self, path: Any) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.stat(path)
