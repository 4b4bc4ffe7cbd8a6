"""What a rank is doing right now, read from another thread: the stack, the collective, the hook.

The watchdog (:mod:`phalanx.trainer.watchdog`) calls :func:`snapshot` from its own thread while the
main thread is blocked inside a collective (torch releases the GIL there, so the main thread's
frames can be read with ``sys._current_frames``). A snapshot is plain data (JSON-ready), so ranks can
send theirs through the rendezvous store to the rank that prints the report. :func:`format_report`
turns the ranks' snapshots into one report: each rank's position (hook, step, the collective it
waits in) and its own frames first, phalanx's and torch's folded; then the first frame where the
ranks' stacks differ, which is where their paths split.
"""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

__all__ = ["first_difference", "format_report", "frame_kind", "frame_text", "snapshot"]

_PHALANX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = tuple(
    {os.path.abspath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]) if p}
)
#: Frames of these kinds are folded in the report: the user's own frames are what they can change.
_FOLDED = ("phalanx", "torch", "library")


def frame_kind(filename: str) -> str:
    """``user``, ``phalanx`` (the core or a ``phalanx_*`` plugin package), ``torch`` or ``library``."""
    path = os.path.abspath(filename)
    parts = path.replace("\\", "/").split("/")
    if path.startswith(_PHALANX_DIR) or any(part.startswith("phalanx_") for part in parts):
        return "phalanx"
    if "torch" in parts:
        return "torch"
    if path.startswith(_LIBRARY_DIRS) or filename.startswith("<"):
        return "library"
    return "user"


def _describe_tensors(frame: FrameType) -> list[str]:
    """Shapes and dtypes of the tensors a torch.distributed frame holds (its arguments, mostly)."""
    found = []
    code = frame.f_code
    arguments = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    local = frame.f_locals
    for name, value in [(name, local.get(name)) for name in arguments]:
        tensors = value if isinstance(value, (list, tuple)) else [value]
        for tensor in tensors[:4]:
            if isinstance(tensor, type):  # a tensor class (a dispatch mode's ``types``): no shape of its own
                continue
            shape = getattr(tensor, "shape", None)
            dtype = getattr(tensor, "dtype", None)
            if shape is None or dtype is None or not type(tensor).__module__.startswith("torch"):
                continue
            try:
                found.append(f"{name}: {str(dtype).replace('torch.', '')}{list(shape)}")
            except TypeError:  # a shape that is not a sequence
                continue
            break
    return found


def _describe_group(frame: FrameType) -> str | None:
    """The process group a torch.distributed frame works on: its name and size.

    torch keeps each group's collective sequence number private (``_get_sequence_number_for_group``),
    so it is not shown; the ranks' different operations and stacks locate the mismatch instead.
    """
    for name in ("group", "pg", "process_group"):
        group = frame.f_locals.get(name)
        if group is None:
            continue
        size = getattr(group, "size", None)
        described = f"group {getattr(group, 'group_name', type(group).__name__)}"
        try:
            described += f" ({size()} ranks)" if callable(size) else ""
        except RuntimeError:  # a group already destroyed
            pass
        return described
    return None


def _collective(frames: Sequence[FrameType]) -> dict[str, Any] | None:
    """The innermost torch.distributed frame: the operation the rank is waiting in, or None."""
    for frame in reversed(frames):
        filename = frame.f_code.co_filename.replace("\\", "/")
        # torch.distributed's tools (the memory tracker's dispatch mode) run in every op, not a collective
        if "/torch/distributed/" in filename and "/torch/distributed/_tools/" not in filename:
            where = filename.split("/torch/distributed/", 1)[1]
            found: dict[str, Any] = {"op": frame.f_code.co_name, "where": f"torch/distributed/{where}:{frame.f_lineno}"}
            if "/fsdp/" in filename:
                found["op"] = f"FSDP {frame.f_code.co_name}"
            tensors = _describe_tensors(frame)
            if tensors:
                found["tensors"] = tensors
            group = _describe_group(frame)
            if group:
                found["group"] = group
            return found
    return None


def _frames_of(thread: threading.Thread) -> list[FrameType]:
    frame = sys._current_frames().get(thread.ident or -1)
    stack: list[FrameType] = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    stack.reverse()
    return stack


def snapshot(*, rank: int, position: dict[str, Any], thread: threading.Thread | None = None) -> dict[str, Any]:
    """This rank's report: where it is (``position``: hook, step, stage), its stack and its collective.

    Args:
        rank: The global rank.
        position: What the Trainer knows (the last hook entered, the step, the stage).
        thread: The thread to read (the main thread by default, where the Trainer runs).
    """
    thread = thread or threading.main_thread()
    frames = _frames_of(thread)
    stack = []
    for frame in frames:
        code = frame.f_code
        line = ""
        try:
            import linecache

            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
        except (OSError, ValueError):  # pragma: no cover - a file that vanished
            pass
        stack.append(
            {
                "file": code.co_filename,
                "line": frame.f_lineno,
                "function": code.co_name,
                "code": line,
                "kind": frame_kind(code.co_filename),
            }
        )
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "position": position,
        "collective": _collective(frames),
        "stack": stack,
    }


def _short(path: str) -> str:
    """A path as a reader recognises it: relative to the working directory, or from the package on."""
    normalised = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in normalised:
            return normalised.split(marker, 1)[1]
    if os.path.abspath(path).startswith(_PHALANX_DIR + os.sep):
        return "phalanx/" + os.path.relpath(path, _PHALANX_DIR).replace("\\", "/")
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if relative.startswith("..") else relative


def frame_text(frame: dict[str, Any]) -> str:
    return f"{_short(frame['file'])}:{frame['line']} in {frame['function']}"


def first_difference(snapshots: Sequence[dict[str, Any]]) -> tuple[int, dict[int, dict[str, Any] | None]] | None:
    """The first frame (from the outermost) where the ranks' stacks differ, per rank; None if all equal.

    Frames are compared by file, line and function: two ranks in the same loop but different hooks
    split at the line that calls the hook.
    """
    if len(snapshots) < 2:
        return None
    stacks = [[(f["file"], f["line"], f["function"]) for f in s["stack"]] for s in snapshots]
    depth = 0
    while all(depth < len(stack) for stack in stacks) and len({stack[depth] for stack in stacks}) == 1:
        depth += 1
    if all(depth >= len(stack) for stack in stacks):
        return None
    return depth, {s["rank"]: (s["stack"][depth] if depth < len(s["stack"]) else None) for s in snapshots}


def _rank_lines(snap: dict[str, Any]) -> list[str]:
    position = snap.get("position", {})
    where = ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in position.items() if value not in (None, ""))
    lines = [f"rank {snap['rank']} (pid {snap['pid']} on {snap['host']}): {where or 'position unknown'}"]
    if snap.get("error"):
        lines.append(f"  {snap['error']}")
    collective = snap.get("collective")
    if collective:
        details = "; ".join([*collective.get("tensors", []), *([collective["group"]] if "group" in collective else [])])
        lines.append(f"  waiting in {collective['op']} ({collective['where']})" + (f": {details}" if details else ""))
    else:
        lines.append("  not inside a torch.distributed call (computing, or waiting on something else)")
    own = [f for f in snap["stack"] if f["kind"] == "user"]
    folded = {kind: sum(1 for f in snap["stack"] if f["kind"] == kind) for kind in _FOLDED}
    summary = ", ".join(f"{count} {kind}" for kind, count in folded.items() if count)
    lines.append(
        f"  your frames, outermost first ({summary} frames folded):"
        if own
        else f"  no frames of your code ({summary} frames)"
    )
    for frame in own:
        lines.append(f"    {frame_text(frame)}")
        if frame["code"]:
            lines.append(f"      {frame['code']}")
    inner_phalanx = next((f for f in reversed(snap["stack"]) if f["kind"] == "phalanx"), None)
    if inner_phalanx is not None and (not own or snap["stack"].index(inner_phalanx) > snap["stack"].index(own[-1])):
        lines.append(f"  innermost phalanx frame: {frame_text(inner_phalanx)}")
    return lines


def format_report(
    snapshots: Sequence[dict[str, Any]],
    *,
    headline: str,
    missing: Sequence[int] = (),
    footer: str = "",
    collectives: Sequence[str] = (),
) -> str:
    """One report for every rank's snapshot: positions, stacks, the first difference, the fix.

    Args:
        snapshots: The ranks' :func:`snapshot` results, in rank order.
        headline: What happened (no progress for N s; a SIGTERM that could not be honoured).
        missing: Ranks whose snapshot did not arrive (dead, or holding the GIL in native code).
        footer: What happens next (the job keeps waiting; it exits).
        collectives: Lines on the ranks' recorded collectives
            (:func:`phalanx.trainer.flight_recorder.format_divergence`), after the stacks.
    """
    lines = [f"[phalanx] hang report: {headline}"]
    for snap in snapshots:
        lines.extend("  " + line for line in _rank_lines(snap))
    for rank in missing:
        lines.append(f"  rank {rank}: no answer (the process is gone, or its native code holds the interpreter lock)")
    difference = first_difference(snapshots)
    if difference is not None:
        depth, frames = difference
        lines.append(f"  the ranks' stacks first differ at frame {depth}:")
        for rank, frame in frames.items():
            lines.append(f"    rank {rank}: {frame_text(frame) if frame else '(its stack ends before)'}")
    lines.extend(collectives)
    ops = {s["rank"]: (s.get("collective") or {}).get("op") for s in snapshots}
    if len(set(ops.values())) > 1:
        listed = ", ".join(f"rank {rank}: {op or 'no collective'}" for rank, op in ops.items())
        lines.append(f"  the ranks wait in different operations ({listed}).")
    lines.append(
        "  Usual cause: code that runs a collective on some ranks only (a forward pass of a sharded model, a "
        "strategy.broadcast / reduce, a barrier inside `if trainer.is_global_zero:`). Fix: run it on every rank "
        "and keep only the printing or saving on rank 0; see 'Hangs' in docs/reliability.md."
    )
    if footer:
        lines.append(f"  {footer}")
    return "\n".join(lines) + "\n"
