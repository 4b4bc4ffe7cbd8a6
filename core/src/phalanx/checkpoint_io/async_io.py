"""Save checkpoints on a background thread so training does not wait for the disk.

Tensors are copied to CPU memory before the call returns; the training loop may then keep
updating the weights while the copy is written. Saves (and removals) run on one thread, in the
order they were requested, so "save new best, then delete old best" cannot happen out of order.

Sharded strategies (``fsdp``, ``model_parallel``) take the same switch: their DCP saves stage the
shards to CPU memory and finish on this thread too (:mod:`phalanx.checkpoint_io.dcp`), so
``Trainer(plugins=[AsyncCheckpointIO()])`` makes every strategy's saves asynchronous.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
from phalanx.utilities.apply_func import apply_to_collection

__all__ = ["AsyncCheckpointIO"]


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


class AsyncCheckpointIO(CheckpointIO):
    """Wrap another CheckpointIO and run its saves on a single background thread.

    Args:
        checkpoint_io: The IO that does the writing; ``TorchCheckpointIO()`` when ``None``.

    A failure on the background thread is re-raised by the next ``save_checkpoint`` call or by
    :meth:`teardown`, so a failed save is never silently lost.
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        self.checkpoint_io: CheckpointIO = checkpoint_io if checkpoint_io is not None else TorchCheckpointIO()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        #: The CPU process group background sharded saves synchronise on (created by the first
        #: one, dropped at teardown, when the strategy's process groups go away).
        self.process_group: Any | None = None
        #: The CPU buffers background sharded saves stage into (reused from one save to the next).
        self.stager: Any | None = None

    def _submit(self, function: Any, *args: Any, **kwargs: Any) -> None:
        def run() -> None:
            try:
                function(*args, **kwargs)
            except BaseException as error:
                with self._lock:
                    if self._error is None:
                        self._error = error

        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="phalanx-ckpt")
        self._pending = [future for future in self._pending if not future.done()]
        self._pending.append(self._executor.submit(run))

    def run_in_background(self, function: Callable[[], None]) -> None:
        """Queue ``function`` behind the earlier saves and removals; its failure surfaces at the next save.

        Raises:
            BaseException: The failure of earlier background work, re-raised here first.
        """
        self._raise_error()
        self._submit(function)

    def _raise_error(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def wait(self) -> None:
        """Block until every queued save/remove has finished; re-raise the first failure."""
        for future in self._pending:
            future.result()
        self._pending = []
        self._raise_error()

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: PathLike,
        storage_options: Any | None = None,
    ) -> None:
        """Snapshot tensors to CPU now and write them in the background."""
        self._raise_error()
        snapshot = apply_to_collection(checkpoint, torch.Tensor, _snapshot)
        self._submit(self.checkpoint_io.save_checkpoint, snapshot, path, storage_options=storage_options)

    def load_checkpoint(
        self,
        path: PathLike,
        map_location: Any | None = None,
        *,
        weights_only: bool = True,
    ) -> dict[str, Any]:
        """Wait for queued saves (the file may be one of them), then load synchronously."""
        self.wait()
        return self.checkpoint_io.load_checkpoint(path, map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: PathLike) -> None:
        """Queue the removal behind earlier saves so it cannot overtake them."""
        self._raise_error()
        self._submit(self.checkpoint_io.remove_checkpoint, path)

    def teardown(self) -> None:
        """Wait for all background work, stop the thread, re-raise any background failure."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            self.process_group = None
            if self.stager is not None:
                self.stager.close()
                self.stager = None
            self.checkpoint_io.teardown()

    def __repr__(self) -> str:
        return f"AsyncCheckpointIO(checkpoint_io={self.checkpoint_io!r})"
