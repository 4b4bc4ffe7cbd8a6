"""torch's flight recorder in a distributed stage: on by default, read by the hang report.

A desync often leaves no trace on any stack: a callback runs a forward pass of a sharded model on
rank 0 only, its all-gathers pair silently with the same-shaped all-gathers of rank 1's next
forward, the callback *returns*, and the job hangs a step later in backward. The line that caused
it is on no stack by then. torch's flight recorder keeps the last collectives each rank issued,
with the Python stack that issued them (gloo and NCCL alike), so the hang report can compare the
ranks' collectives position by position and name the first one where they differ: per rank, the
operation, the sizes, the line that issued it and the hook it ran in.

- :func:`enable` turns it on before the stage creates its process group (``TORCH_FR_BUFFER_SIZE``,
  :data:`ENTRIES` collectives per process), unless the hang report is off
  (``Trainer(hang_report_after=None)``) or the user set ``TORCH_FR_BUFFER_SIZE`` (``0``: off).
- :func:`read` (in the watchdog's thread, at report time) returns torch's dump and a compact list
  of the recorded collectives that travels with the rank's snapshot.
- :func:`write` puts the dump beside the logs: ``fr_rank_<R>`` in torch's own format (what
  ``python -m torch.distributed.flight_recorder.fr_trace DIR --prefix fr_rank_`` reads) and
  ``rank_<R>.json``.
- :func:`first_divergence` and :func:`format_divergence` compare the ranks' lists.

Cost: recording a collective captures its Python stack, tens of microseconds per collective on
CPU (``benchmarks/bench_flight_recorder.py`` measures it); nothing else runs until a report.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Sequence
from typing import Any

from phalanx.trainer.hang_report import frame_kind, frame_text

__all__ = ["ENTRIES", "ENV", "enable", "first_divergence", "format_divergence", "read", "write"]

#: Collectives kept per process: the last few steps of a large sharded model.
ENTRIES = 2000
#: torch's variable (read when the first process group is created).
ENV = "TORCH_FR_BUFFER_SIZE"
#: Recorded collectives sent with a snapshot (per process group, the newest).
SENT = 64
#: The Trainer's step (forward, backward, optimizer step): a collective issued under it without a
#: hook of its own on the stack (FSDP's pre-forward all-gather) ran in the training step.
_STEP_FILE = os.path.join("phalanx", "trainer", "step.py")
#: Hooks a collective can be issued from, besides any ``on_*`` hook.
_HOOKS = frozenset(
    {
        "training_step", "validation_step", "test_step", "predict_step", "configure_model",
        "configure_sharded_model", "configure_optimizers", "setup", "teardown", "backward",
        "optimizer_step", "lr_scheduler_step", "prepare_data", "state_dict", "load_state_dict",
    }
)  # fmt: skip


def enable(*, world_size: int, hang_report: bool) -> bool:
    """Turn the recorder on for this process's process groups (call before the first is created).

    Returns whether it is on: a distributed stage with the hang report on, unless the user's own
    ``TORCH_FR_BUFFER_SIZE`` says otherwise (``0`` turns it off).
    """
    if world_size > 1 and hang_report:
        os.environ.setdefault(ENV, str(ENTRIES))
    try:
        return int(os.environ.get(ENV, "0")) > 0
    except ValueError:
        return False


def read() -> tuple[bytes, list[dict[str, Any]]] | None:
    """torch's dump of this process's recorder and the compact list of its collectives; None when
    nothing was recorded (the recorder is off, or this torch has none)."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]  # not in the stubs

        raw = _dump_fr_trace()
        entries = pickle.loads(raw).get("entries", [])
    except Exception:  # an older torch, or no recorder: the report goes on without it
        return None
    if not entries:
        return None
    compact = [_compact(entry) for entry in entries]
    newest: dict[str, list[dict[str, Any]]] = {}
    for entry in compact:
        newest.setdefault(entry["group"], []).append(entry)
    return raw, [entry for group in newest.values() for entry in group[-SENT:]]


def write(raw: bytes, folder: str, rank: int) -> str:
    """Write ``raw`` (from :func:`read`) into ``folder`` for ``rank``; returns the folder.

    Two files: ``fr_rank_<rank>`` (torch's pickle, what its ``fr_trace`` tool reads) and
    ``rank_<rank>.json``. Each is written to a temporary name and then renamed.
    """
    os.makedirs(folder, exist_ok=True)
    dump = pickle.loads(raw)
    if not any(config.get("ranks") not in (None, "", "[]") for config in dump.get("pg_config", {}).values()):
        dump["pg_config"] = _group_config()  # gloo leaves it empty; fr_trace needs each group's ranks
        raw = pickle.dumps(dump)
    for name, data in ((f"fr_rank_{rank}", raw), (f"rank_{rank}.json", json.dumps(dump, default=str).encode())):
        partial = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
        with open(partial, "wb") as handle:
            handle.write(data)
        os.replace(partial, os.path.join(folder, name))
    return folder


def _group_config() -> dict[str, dict[str, str]]:
    """Each process group of this process as torch's dump describes it: name, description, global ranks."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        return {
            name: {
                "name": name,
                "desc": getattr(group, "group_desc", ""),
                "ranks": str(dist.get_process_group_ranks(group)),
            }
            for group, name in distributed_c10d._world.pg_names.items()
        }
    except Exception:  # a torch without these: the dump keeps what torch wrote
        return {}


def _compact(entry: dict[str, Any]) -> dict[str, Any]:
    """One recorded collective as the report compares it: group, position, operation, sizes, call site."""
    group = entry.get("process_group") or ("", "")
    frames = [
        {"file": f.get("filename", ""), "line": int(f.get("line", 0) or 0), "function": f.get("name", "")}
        for f in entry.get("frames", [])
    ]  # innermost first
    for frame in frames:
        frame["kind"] = frame_kind(frame["file"])
    user = next((f for f in frames if f["kind"] == "user"), None)
    own = next((f for f in frames if f["kind"] == "phalanx"), None)
    hook = next((f["function"] for f in frames if f["function"].startswith("on_") or f["function"] in _HOOKS), None)
    if hook is None and any(f["kind"] == "phalanx" and f["file"].endswith(_STEP_FILE) for f in frames):
        hook = "the training step"  # a sharded model's forward/backward hooks, before training_step is entered
    p2p = bool(entry.get("is_p2p"))
    return {
        "group": str(group[1] or group[0]),
        "seq": int(entry.get("p2p_seq_id" if p2p else "collective_seq_id", 0) or 0),
        "p2p": p2p,
        "op": str(entry.get("profiling_name", "")),
        "sizes": entry.get("input_sizes", []),
        "site": user or own,
        "via": own if user is not None and own is not None and frames.index(own) < frames.index(user) else None,
        "hook": hook,
        "created": int(entry.get("time_created_ns", 0) or 0),
    }


def _key(entry: dict[str, Any]) -> tuple[Any, ...]:
    site = entry.get("site") or {}
    return entry["op"], json.dumps(entry["sizes"]), site.get("file"), site.get("line")


def first_divergence(snapshots: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The first recorded collective where the ranks differ (operation, sizes or the line that
    issued it), or where one rank has issued one the others have not; None if they agree.

    Collectives are compared per process group by their sequence number; of the differences in
    several groups, the one a rank issued first is named. Returns ``{"group", "seq", "entries":
    {rank: entry or None}}``.
    """
    recorded = {s["rank"]: s["collectives"] for s in snapshots if s.get("collectives")}
    if len(recorded) < 2:
        return None
    by_rank = {rank: {(e["group"], e["p2p"], e["seq"]): e for e in entries} for rank, entries in recorded.items()}
    positions = sorted(set().union(*(positions.keys() for positions in by_rank.values())))
    found = []
    for position in positions:
        entries = {rank: by_rank[rank].get(position) for rank in by_rank}
        present = [entry for entry in entries.values() if entry is not None]
        # A position some ranks have left out of their newest SENT entries is not a difference.
        oldest = [min(p[2] for p in by_rank[rank] if p[:2] == position[:2]) for rank in by_rank]
        if position[2] < max(oldest):
            continue
        if len(present) < len(entries) or len({_key(entry) for entry in present}) > 1:
            found.append((min(entry["created"] for entry in present), position, entries))
    if not found:
        return None
    _, position, entries = min(found, key=lambda item: item[0])
    return {"group": position[0], "seq": position[2], "entries": entries}


def _describe(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "(none yet: this rank has not issued it)"
    text = f"{entry['op'] or 'a collective'} {entry['sizes']}"
    if entry.get("site"):
        text += f" from {frame_text(entry['site'])}"
    if entry.get("via"):
        text += f" (through {frame_text(entry['via'])})"
    if entry.get("hook") and entry["hook"] != (entry.get("site") or {}).get("function"):
        text += f", in {entry['hook']}"
    return text


def format_divergence(snapshots: Sequence[dict[str, Any]]) -> list[str]:
    """The report's lines on the recorded collectives (none when no rank sent any)."""
    sent = sum(1 for s in snapshots if s.get("collectives"))
    if not sent:
        return []
    divergence = first_divergence(snapshots)
    if sent < 2:  # one rank's list: nothing to compare it with
        lines = []
    elif divergence is None:
        lines = ["  the ranks' recorded collectives (torch's flight recorder) agree, as far back as they go"]
    else:
        lines = [
            f"  the ranks' collectives first differ at collective #{divergence['seq']} of group "
            f"{divergence['group']!r} (torch's flight recorder; what each rank issued there):"
        ]
        lines.extend(f"    rank {rank}: {_describe(entry)}" for rank, entry in sorted(divergence["entries"].items()))
    folders = sorted({s["recorded_to"] for s in snapshots if s.get("recorded_to")})
    for folder in folders:
        lines.append(
            f"  recorded collectives of every rank: {folder} (rank_<R>.json; fr_rank_<R> for "
            f"python -m torch.distributed.flight_recorder.fr_trace {folder} --prefix fr_rank_)"
        )
    return lines
