"""Background sharded saves: torch's ``async_save`` behind :class:`AsyncCheckpointIO`'s one thread.

Why through ``AsyncCheckpointIO`` and not a strategy argument: it is Lightning's switch for
"do not make the loop wait for the disk" (``Trainer(plugins=[AsyncCheckpointIO()])``), it already
owns the rules a background save needs (one background thread, work in request order, a failure
re-raised at the next save or at teardown, loads wait for pending saves), and it reaches every
strategy the same way, so a sharded strategy gets asynchronous saves without an option of its own.

The loop waits only while DCP copies this rank's shards to CPU memory (torch's staging); the
write runs on DCP's thread, synchronising the ranks over a dedicated CPU (gloo) process group so
that it never interleaves with the training's collectives. A job queued on the
``AsyncCheckpointIO`` thread then waits for that write and, on rank 0, publishes the staging
directory: DCP's final step gathers every rank's write result on rank 0 before it writes
``.metadata``, so rank 0's write finishing means every rank's has.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp

from phalanx.checkpoint_io.async_io import AsyncCheckpointIO
from phalanx.checkpoint_io.atomic import publish_directory
from phalanx.errors import CheckpointError

__all__ = ["first_cause", "save_in_background"]

log = logging.getLogger("phalanx.checkpoint_io.dcp")


def first_cause(error: BaseException) -> str:
    """One line saying what went wrong: DCP's own exception only lists ranks, its ``failures`` the cause."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, cause = next(iter(failures.items()))
        cause = getattr(cause, "exc", cause)  # some torch versions wrap it with the traceback
        return f"rank {rank}: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _cpu_group(checkpoint_io: AsyncCheckpointIO) -> Any:
    """The gloo group background saves synchronise on, created collectively at the first one."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if checkpoint_io.process_group is None:
        checkpoint_io.process_group = dist.new_group(backend="gloo")
    return checkpoint_io.process_group


def _stager(checkpoint_io: AsyncCheckpointIO) -> Any:
    """The CPU staging buffers, kept for the run: later saves copy into them instead of allocating anew.

    Safe to reuse because only one save is in flight: the next one waits for the previous write.
    """
    if checkpoint_io.stager is None:
        import torch
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        options = StagingOptions(
            use_pinned_memory=torch.cuda.is_available(),
            use_shared_memory=False,
            use_async_staging=False,
            use_non_blocking_copy=False,
        )
        checkpoint_io.stager = DefaultStager(options)
    return checkpoint_io.stager


def save_in_background(
    state: dict[str, Any],
    writer: Any,
    *,
    staging: str,
    target: str,
    checkpoint_io: AsyncCheckpointIO,
    is_global_zero: bool,
    started: float,
) -> None:
    """Stage ``state`` to CPU now, write it to ``staging`` on a thread, publish it as ``target`` when done."""
    name = os.path.basename(target.rstrip("/"))
    group = _cpu_group(checkpoint_io)
    response = torch_dcp.async_save(
        state, storage_writer=writer, process_group=group, async_stager=_stager(checkpoint_io)
    )
    # A Future, or (with a stager that stages in the background) a pair of them: wait for the upload.
    future: Any = getattr(response, "upload_completion", response)
    blocked = time.perf_counter() - started
    queued = time.perf_counter()

    def finish() -> None:
        try:
            future.result()
        except BaseException as error:
            msg = (
                f"The background save of the checkpoint {target!r} failed: {first_cause(error)}. The previous "
                "checkpoint at that path (if any) is untouched. Fix: check the storage (space, permissions, "
                "credentials), or save synchronously without AsyncCheckpointIO to see the error where it happens."
            )
            raise CheckpointError(msg) from error
        if is_global_zero:
            publish_directory(staging, target)
            log.info(
                "checkpoint %s: blocked %.2f s, written in the background in %.2f s",
                name,
                blocked,
                time.perf_counter() - queued,
            )

    checkpoint_io.run_in_background(finish)
