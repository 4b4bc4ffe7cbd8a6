"""Say which rank did not arrive when a collective times out, and in which operation.

A rank that stops taking part (stuck in a step, or skipping a collective) leaves the others waiting
in a collective until the strategy's ``timeout``; torch then raises an error that names neither the
missing rank nor what the waiting ranks were doing. After such a timeout, the waiting rank asks
every rank to check in at a ``monitored_barrier`` (a short one) on a small gloo group made for this
at setup (the timed-out group's connections are closed by then), which lists the ranks that do not
answer; the operation is read off the traceback (the innermost phalanx call). The explanation is
added to the error as a note, so the traceback the launcher prints says it.
"""

from __future__ import annotations

import re
from datetime import timedelta

import torch.distributed as dist

__all__ = ["explain_timeout", "is_collective_timeout", "new_check_in_group"]

#: How long the diagnosis waits for the other ranks to check in.
CHECK_IN_SECONDS = 2.0
_TIMEOUT_WORDS = ("timed out", "timeout")
_MISSING = re.compile(r"[Rr]anks? ([\d, ]+) failed to pass monitoredBarrier")


def is_collective_timeout(error: BaseException) -> bool:
    """Whether ``error`` is a collective that gave up waiting for other ranks."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(word in text for word in _TIMEOUT_WORDS)


def _operation(error: BaseException) -> str:
    """What the rank was doing: the innermost phalanx (or strategy-package) function on the
    traceback, or ``backward`` when that function was running autograd's backward pass (the
    loop's direct step calls ``loss.backward()`` from its closure)."""
    name = "a collective"
    in_backward = False
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        filename = code.co_filename.replace("\\", "/")
        if "/phalanx" in filename:
            name, in_backward = code.co_name, False
        elif code.co_name == "backward" and "/torch/" in filename:
            in_backward = True
        tb = tb.tb_next
    return "backward" if in_backward else name


def new_check_in_group() -> dist.ProcessGroup | None:
    """A gloo group over the whole world for :func:`explain_timeout` (collective: every rank calls it)."""
    if not dist.is_gloo_available():
        return None
    try:
        return dist.new_group(backend="gloo")
    except RuntimeError:
        return None


def explain_timeout(
    error: BaseException, *, rank: int, world_size: int, timeout: timedelta | None, group: dist.ProcessGroup | None
) -> str | None:
    """Find the ranks that do not check in, and return one sentence for the error; None if unsure.

    Without a check-in group (gloo missing) the sentence names the operation and the timeout only.
    """
    if not (dist.is_available() and dist.is_initialized()) or world_size <= 1:
        return None
    waited = f"{timeout.total_seconds():g} s" if timeout is not None else "the process-group timeout"
    where = f"rank {rank} waited {waited} in {_operation(error)}()"
    missing: list[int] = []
    if group is not None:
        try:
            dist.monitored_barrier(group, timeout=timedelta(seconds=CHECK_IN_SECONDS), wait_all_ranks=True)
        except RuntimeError as check:
            found = _MISSING.search(str(check))
            if found:
                missing = [int(part) for part in found.group(1).replace(" ", "").split(",") if part]
    if missing:
        who = ", ".join(str(r) for r in missing)
        return (
            f"{where} for rank(s) {who}, which did not arrive (still inside a step, or skipped this collective). "
            f"Fix: make every rank run the same collectives in the same order; look at rank(s) {who} first."
        )
    return (
        f"{where}, and another rank did not arrive. Fix: make every rank run the same collectives in the same order "
        "(a rank-dependent branch around a collective is the usual cause)."
    )
