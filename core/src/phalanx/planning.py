"""Planning a run before launching it: ask every strategy's plugin for an estimate, and report.

Shared by ``phalanx plan`` and ``Trainer.plan``: both describe the model once on the meta device
(:mod:`phalanx.model_shapes`), then ask the ``phalanx_estimate_memory`` hook once per strategy
name. A name that is not usable here is still planned (what it would cost is worth knowing before
installing it), with its reason. This module sits above the plugin machinery (it calls
:func:`phalanx.discovery.decide`), while the data it passes around lives below it in
:mod:`phalanx.memory`, which the hook contract names; so the import graph has no cycle.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from phalanx.discovery import decide
from phalanx.errors import MisconfigurationError
from phalanx.memory import MemoryEstimate, MemoryRequest, ModelSummary, format_bytes
from phalanx.registry import StrategyRegistry

__all__ = ["PlanReport", "PlanRow", "estimate_memory", "plan_strategies"]


@dataclass(frozen=True)
class PlanRow:
    """One strategy's answer: its estimate (``None``: "no estimate") and whether it fits."""

    strategy: str
    estimate: MemoryEstimate | None
    fits: bool | None
    available: bool = True
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form; ``estimate`` is ``None`` for a strategy that gave no estimate."""
        return {
            "strategy": self.strategy,
            "estimate": None if self.estimate is None else self.estimate.as_dict(),
            "fits": self.fits,
            "available": self.available,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class PlanReport:
    """What a run would cost per rank under each strategy, for one model and one world.

    ``str(report)`` is the table ``phalanx plan`` prints; :meth:`as_dict` is its ``--json``.
    """

    model: ModelSummary
    rows: tuple[PlanRow, ...]
    devices: int
    num_nodes: int
    precision: str
    optimizer: str
    device_memory: int | None = None
    advice: tuple[str, ...] = field(default=())

    def row(self, strategy: str) -> PlanRow:
        """The row of ``strategy`` (KeyError naming the planned ones otherwise)."""
        for row in self.rows:
            if row.strategy == strategy:
                return row
        msg = f"{strategy!r} was not planned; planned: {[r.strategy for r in self.rows]}"
        raise KeyError(msg)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``phalanx plan --json``)."""
        return {
            "model": {
                "parameters": self.model.numel,
                "trainable": self.model.trainable_numel,
                "buffer_bytes": self.model.buffer_bytes,
                "activation_bytes": self.model.activation_bytes,
                "input_shape": None if self.model.input_shape is None else list(self.model.input_shape),
            },
            "devices": self.devices,
            "num_nodes": self.num_nodes,
            "world_size": self.devices * self.num_nodes,
            "precision": self.precision,
            "optimizer": self.optimizer,
            "device_memory": self.device_memory,
            "strategies": [row.as_dict() for row in self.rows],
            "advice": list(self.advice),
        }

    def __str__(self) -> str:
        return render(self)


def estimate_memory(request: MemoryRequest) -> MemoryEstimate | None:
    """Ask the installed plugins (one ``firstresult`` pluggy call) for ``request``; ``None``: no answer.

    Raises:
        MisconfigurationError: A plugin answered with something other than a ``MemoryEstimate``;
            names the strategy, the answer and whose hook to fix.
        PluginHookError: A plugin's hook raised; names the plugin and how to block it.
    """
    answer = decide("phalanx_estimate_memory", request=request)
    if answer is not None and not isinstance(answer, MemoryEstimate):
        msg = (
            f"A plugin answered phalanx_estimate_memory for {request.strategy!r} with {answer!r}; the hook must "
            "return a phalanx.memory.MemoryEstimate or None. Fix that plugin's hook implementation."
        )
        raise MisconfigurationError(msg)
    return answer


def plan_strategies(
    model: ModelSummary,
    names: Iterable[str],
    *,
    devices: int,
    num_nodes: int,
    precision: str,
    optimizer: str,
    device_memory: int | None = None,
    init_params: Mapping[str, Mapping[str, Any]] | None = None,
    device_type: str = "cuda",
) -> PlanReport:
    """Ask the hook for each name; ``init_params`` overrides a name's registered params.

    ``device_type`` is the ranks' device type (:attr:`MemoryRequest.device_type`): ``phalanx plan``
    plans for CUDA; ``Trainer.plan`` passes its own devices' type.
    """
    rows = []
    for name in names:
        entry = StrategyRegistry.entry(name)
        params = {**entry.init_params, **(init_params or {}).get(name, {})}
        request = MemoryRequest(
            strategy=name,
            target=entry.target_path,
            init_params=params,
            model=model,
            devices=devices,
            num_nodes=num_nodes,
            precision=precision,
            optimizer=optimizer,
            device_type=device_type,
        )
        found = estimate_memory(request)
        fits = None if found is None or device_memory is None else found.fits(device_memory)
        reason = entry.unavailable_reason()
        rows.append(PlanRow(name, found, fits, available=reason is None, reason=reason))
    report = PlanReport(model, tuple(rows), devices, num_nodes, precision, optimizer, device_memory)
    return PlanReport(**{**report.__dict__, "advice": advise(report)})


def advise(report: PlanReport) -> tuple[str, ...]:
    """What to change when nothing fits: more ranks, offload, a mesh, a smaller precision."""
    if report.device_memory is None:
        return ()
    answered = [row for row in report.rows if row.estimate is not None]
    if not answered or any(row.fits for row in answered):
        return ()
    best = min(answered, key=lambda row: row.estimate.total)  # type: ignore[union-attr]
    assert best.estimate is not None
    tips = [
        f"nothing fits {format_bytes(report.device_memory)}; the smallest is {best.strategy} at "
        f"{format_bytes(best.estimate.total)} per rank"
    ]
    sharded = best.estimate.parameters + best.estimate.gradients + best.estimate.optimizer_states
    spare = report.device_memory - best.estimate.total + sharded
    world = report.devices * report.num_nodes
    if spare > 0 and sharded > 0:
        needed = world * sharded / spare
        if needed > world:
            nodes = -(-int(needed) // report.devices)
            tips.append(f"more ranks: about {int(needed) + 1} ({nodes} nodes of {report.devices}) for {best.strategy}")
    if best.estimate.peak_other > report.device_memory // 2:
        tips.append(
            f"OTHER ({format_bytes(best.estimate.peak_other)}, gathered units / buckets) dominates: gather per "
            "block (fsdp auto_wrap_policy)"
        )
    if not any(row.strategy.endswith("offload") for row in answered):
        tips.append("offload: plan --strategy deepspeed_stage_3_offload or fsdp_cpu_offload (CPU memory)")
    if report.model.activation_bytes:
        tips.append("activations: a smaller --input-shape (micro-batch) or activation checkpointing")
    if not report.precision.startswith(("bf16", "16")):
        tips.append("precision: --precision bf16-true halves weights, gradients and state")
    tips.append("a mesh: --strategy model_parallel splits layers over tensor-parallel ranks")
    return tuple(tips)


_NAME = 28
_MIN_NAME = 16
_CELL = 8
_FITS = 6
_NUMBERS = ("PARAMS", "GRADS", "OPTIM", "ACTIV", "OTHER", "TOTAL")
#: Dropped in this order when the terminal is too narrow; TOTAL and FITS answer "does it fit" and stay.
_DROP_ORDER = ("ACTIV", "PARAMS", "GRADS", "OPTIM", "OTHER")
_ELLIPSIS = "..."
_FOLDED = re.compile(r" \(\+\d+\)")

#: Under the table, because the column titles are too short to say what is counted where.
_LEGEND = (
    "PARAMS GRADS OPTIM: weights, gradients, optimizer state (and fp32 master weights) one rank keeps",
    "ACTIV: saved for backward, one --input-shape micro-batch; FITS: TOTAL against --device-memory",
    "OTHER: the rest of TOTAL: ddp gradient buckets; deepspeed reduce buckets + the largest gathered "
    "layer; fsdp the largest unit gathered at once (the whole model without an auto_wrap_policy); "
    "or the optimizer step's temporaries when they are larger",
    "HOST: what offloading keeps in CPU memory (cpu:) or on NVMe (nvme:), not on the device",
)


def _count(numel: int) -> str:
    return f"{numel / 1e9:.3g}B" if numel >= 10**9 else f"{numel / 1e6:.3g}M"


def _cell(value: int | None) -> str:
    return format_bytes(value).replace(" ", "")


def _cut_middle(name: str, limit: int, tail: int) -> str:
    """``name`` in ``limit`` characters: its start, "...", and its last ``tail`` characters."""
    if len(name) <= limit:
        return name
    tail = max(1, min(tail, limit - len(_ELLIPSIS) - 1))
    return name[: limit - len(_ELLIPSIS) - tail] + _ELLIPSIS + name[len(name) - tail :]


def short_names(names: Sequence[str], limit: int) -> list[str]:
    """Every name in ``limit`` characters, cut in the middle, and no two alike.

    Variants differ at the end (``ddp_find_unused_parameters_true`` / ``_false``,
    ``..._offload_nvme``), so a cut keeps the last ``_`` component (and the fold count or ``*``
    after it) and drops characters from the middle; where two cut names still collide, more of
    their ends is kept until they differ.
    """
    tails = []
    for name in names:
        last = name.rfind("_")
        tails.append(len(name) - last if last > 0 else limit // 2)
    shown = [_cut_middle(name, limit, tail) for name, tail in zip(names, tails)]
    for _ in range(limit):
        clashes = {i for i, text in enumerate(shown) if shown.count(text) > 1 and len(names[i]) > limit}
        if not clashes:
            break
        for i in clashes:
            tails[i] += 1
            shown[i] = _cut_middle(names[i], limit, tails[i])
    return shown


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _layout(host_width: int, width: int) -> tuple[list[str], int]:
    """The number columns shown and the name column's width, so one row fits in ``width``.

    A narrow terminal loses detail columns (then name characters) rather than the row's end: a
    row cut at the edge would drop TOTAL and FITS, the two that answer the question.
    """
    columns = list(_NUMBERS)

    def needed(name: int) -> int:
        return name + _CELL * len(columns) + _FITS + host_width

    for title in _DROP_ORDER:
        if needed(_NAME) <= width:
            break
        columns.remove(title)
    return columns, max(_MIN_NAME, min(_NAME, width - needed(0)))


def _summary(report: PlanReport, width: int) -> list[str]:
    world = report.devices * report.num_nodes
    text = (
        f"{_count(report.model.numel)} parameters; {_plural(world, 'rank')} ({report.num_nodes} x {report.devices}); "
        f"{report.precision}; {report.optimizer}"
        + (f"; {format_bytes(report.device_memory)} per device" if report.device_memory else "")
    )
    return textwrap.wrap(text, width=width, subsequent_indent="  ", break_on_hyphens=False)


def render(report: PlanReport, *, width: int | None = None) -> str:
    """The table: one row per strategy, at most 100 columns (the terminal's width when smaller)."""
    width = min(100, width or shutil.get_terminal_size((100, 24)).columns)
    lines = _summary(report, width)
    bytes_line = "per-rank bytes on the device" + (
        "" if report.model.activation_bytes else " (no --input-shape: ACTIV -)"
    )
    lines += textwrap.wrap(bytes_line, width=width, subsequent_indent="  ", break_on_hyphens=False)
    hosts = []
    for row in report.rows:
        est = row.estimate
        pairs = () if est is None else (("cpu", est.cpu), ("nvme", est.nvme))
        hosts.append(" ".join(f"{kind}:{_cell(value)}" for kind, value in pairs if value))
    columns, name_width = _layout(max(len("HOST"), *(len(h) for h in hosts)), width)
    lines.append(
        "".join(t.ljust(s) for t, s in [("STRATEGY", name_width)] + [(c, _CELL) for c in columns]) + "FITS  HOST"
    )
    names = short_names([row.strategy + ("" if row.available else " *") for row in report.rows], name_width - 1)
    for name, row, host in zip(names, report.rows, hosts):
        if row.estimate is None:
            lines.append(name.ljust(name_width) + "no estimate")
            continue
        est = row.estimate
        values = dict(
            zip(_NUMBERS, (est.parameters, est.gradients, est.optimizer_states, est.activations, est.peak_other, est.total))
        )
        fits = "-" if row.fits is None else ("yes" if row.fits else "NO")
        cells = "".join(_cell(values[c]).ljust(_CELL) for c in columns)
        lines.append((name.ljust(name_width) + cells + fits.ljust(_FITS) + host).rstrip())
    single = report.rows[0].estimate if len(report.rows) == 1 else None
    if single is not None and (single.layout or single.notes):  # one strategy: how its plugin spread the state
        detail = "; ".join(filter(None, (single.layout, *single.notes)))
        lines += textwrap.wrap(f"layout: {detail}", width=width, subsequent_indent="  ", break_on_hyphens=False)
    notes = []
    if not all(row.available for row in report.rows):
        notes.append("* not usable here (planned anyway): see `phalanx strategies` for the reason")
    if any(_FOLDED.search(row.strategy) for row in report.rows):
        notes.append("(+N): N more names with the same estimate, folded into this one; --all lists them")
    hidden = [c for c in _NUMBERS if c not in columns and (c != "ACTIV" or report.model.activation_bytes)]
    if hidden:
        notes.append(f"{', '.join(hidden)} not shown in {width} columns: widen the terminal or pass --json")
    for note in notes:
        lines += textwrap.wrap(note, width=width, subsequent_indent="  ", break_on_hyphens=False)
    for entry in _LEGEND:
        lines += textwrap.wrap(entry, width=width, subsequent_indent="  ", break_on_hyphens=False)
    for tip in report.advice:
        lines += textwrap.wrap(
            tip, width=width, initial_indent="  - ", subsequent_indent="    ", break_on_hyphens=False
        )
    if report.model.activation_note:
        note = f"activations unknown: {report.model.activation_note}"
        lines += textwrap.wrap(note, width=width, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(line if len(line) <= width else line[:width] for line in lines)
