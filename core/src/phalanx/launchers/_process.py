"""Process control shared by the launchers: parent-death signals, stopping a job, rank tracebacks.

A distributed job must die as one: a rank that fails leaves the others blocked in a collective
until a timeout of many minutes, and a parent that dies must not leave orphans holding ports and
memory. These helpers give both launchers the same behaviour: children get a parent-death signal,
a failure stops every process (SIGTERM, a short grace, then SIGKILL), and each failing rank prints
its traceback once, every line prefixed with its rank so interleaved output stays readable.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Protocol

__all__ = [
    "GRACE_SECONDS",
    "SECONDARY_FAILURE_DELAY",
    "ProcessHandle",
    "exit_code_of",
    "install_rank_excepthook",
    "print_rank_traceback",
    "set_parent_death_signal",
    "stop_processes",
    "tag_exception",
]

#: Time a process gets to exit after SIGTERM before SIGKILL. Short: the job already failed.
GRACE_SECONDS = 1.0
#: A failing rank waits this long before printing, so that a rank failing only *because* another
#: one died (a collective saw the peer vanish) is stopped by its launcher before it adds noise.
SECONDARY_FAILURE_DELAY = 0.3
_PR_SET_PDEATHSIG = 1
_RANK_ATTR = "_phalanx_rank"
_QUIET_ATTR = "_phalanx_quiet"
_hook_lock = threading.Lock()
_hook_state: dict[str, Any] = {"installed": False, "fast_exit": False, "delay": True}


class ProcessHandle(Protocol):
    """What :func:`stop_processes` needs from a process (adapters wrap Popen and mp.Process)."""

    pid: int

    def alive(self) -> bool: ...

    def wait(self, timeout: float) -> None: ...


def set_parent_death_signal(signum: int = signal.SIGKILL) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies (Linux; no-op elsewhere).

    Without it, killing a launcher with SIGKILL (an OOM killer, ``kill -9``, a CI timeout) would
    leave its ranks running forever, blocked in a collective.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        return


def exit_code_of(returncode: int) -> int:
    """A shell-style exit code for a child's return code (``-N`` for signal N becomes ``128 + N``)."""
    return 128 - returncode if returncode < 0 else returncode


def stop_processes(handles: Sequence[ProcessHandle], grace: float = GRACE_SECONDS) -> None:
    """Stop every live process: SIGTERM, wait up to ``grace`` seconds, SIGKILL the rest, reap all.

    SIGTERM first lets a process that handles it clean up; SIGKILL follows because a rank blocked
    inside a C++ collective never runs a Python signal handler.
    """
    for handle in handles:
        _signal(handle.pid, signal.SIGTERM, handle)
    deadline = time.monotonic() + grace
    for handle in handles:
        handle.wait(max(0.0, deadline - time.monotonic()))
    for handle in handles:
        if handle.alive():
            _signal(handle.pid, signal.SIGKILL, handle)
        handle.wait(5.0)


def _signal(pid: int, signum: int, handle: ProcessHandle) -> None:
    if handle.alive():
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def tag_exception(exc: BaseException, rank: int, *, quiet: bool = False) -> None:
    """Mark ``exc`` as raised by ``rank`` so that, if uncaught, the rank excepthook prints it.

    ``quiet`` marks a summary error (e.g. "rank 1 failed") whose own traceback adds nothing: only
    its message is printed.
    """
    try:
        setattr(exc, _RANK_ATTR, rank)
        if quiet:
            setattr(exc, _QUIET_ATTR, True)
    except (AttributeError, TypeError):  # pragma: no cover - exceptions with __slots__
        pass


def print_rank_traceback(
    rank: int, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    """Print a traceback with every line prefixed ``[rank N]``, in one write so ranks don't interleave."""
    lines = traceback.format_exception(exc_type, exc, tb)
    text = "".join(lines).rstrip("\n")
    _write("".join(f"[rank {rank}] {line}\n" for line in text.split("\n")))


def _write(text: str) -> None:
    """Write to the real stderr: torch's own rank excepthook swaps ``sys.stderr`` for a buffer that
    would be lost when a failing rank exits at once."""
    stream = sys.__stderr__ or sys.stderr
    stream.write(text)
    stream.flush()


def install_rank_excepthook(*, fast_exit: bool, delay: bool = True) -> None:
    """Print uncaught rank-tagged exceptions with their rank; chain to the previous hook otherwise.

    Args:
        fast_exit: End the process right after printing (``os._exit(1)``) instead of running the
            interpreter's shutdown. The job is over (a launching parent has already stopped its
            children by then), and shutdown (process-group destructors, torch's atexit handlers)
            can take seconds on a loaded machine, breaking the promise of a fast stop.
        delay: Wait :data:`SECONDARY_FAILURE_DELAY` before printing (see there). A launching
            parent has already waited for its children, so it passes False.
    """
    with _hook_lock:
        _hook_state["fast_exit"] = _hook_state["fast_exit"] or fast_exit
        _hook_state["delay"] = delay
        if _hook_state["installed"]:
            return
        _hook_state["installed"] = True
        previous: Callable[..., Any] = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        rank = getattr(exc, _RANK_ATTR, None)
        if rank is None:
            previous(exc_type, exc, tb)
            return
        if _hook_state["delay"] and not isinstance(exc, KeyboardInterrupt):
            time.sleep(SECONDARY_FAILURE_DELAY)
        if isinstance(exc, KeyboardInterrupt):
            quiet = getattr(exc, _QUIET_ATTR, False)
            _write("[phalanx] interrupted; stopped all ranks\n" if quiet else f"[rank {rank}] interrupted\n")
        elif getattr(exc, _QUIET_ATTR, False):
            _write(f"[phalanx] {exc_type.__name__}: {exc}\n")
        else:
            print_rank_traceback(rank, exc_type, exc, tb)
        if _hook_state["fast_exit"]:
            sys.stdout.flush()
            os._exit(130 if isinstance(exc, KeyboardInterrupt) else 1)

    sys.excepthook = hook
