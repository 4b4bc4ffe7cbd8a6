"""Shared pieces of the benchmark scripts: samples, target rows, JSON results, ``--quick``.

Every script measures raw PyTorch and phalanx (and, where installed, Lightning) side by side in
the same invocation and ends with target rows. A row carries its measured value, the target, the
verdict and by how much it was missed, so a number is never quoted without what it was held to;
:func:`finish` prints the rows, writes them to ``docs/img/bench_<name>.json`` (the plots and the
docs table are drawn from those files) and returns the exit status: 1 when any target is missed.

``--quick`` (used by the integration session) runs each script for a few steps only, to prove that
it still works; its numbers mean nothing, so quick runs print their rows but never fail on a
target and never overwrite the recorded results.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "Row", "Spread", "child_env", "finish", "machine", "pin_threads", "run_quiet", "spread"]

#: Where results and plots go (the docs page shows them).
RESULTS = Path(__file__).resolve().parent.parent / "docs" / "img"


def pin_threads() -> None:
    """One intra-op thread everywhere: on a shared 2-core machine more threads only add noise."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements (the range is the noise the median hides)."""

    median: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.median:.4g} [{self.low:.4g}..{self.high:.4g}, n={self.n}]"


def spread(values: Sequence[float]) -> Spread:
    """Median, minimum and maximum of ``values``."""
    return Spread(statistics.median(values), min(values), max(values), len(values))


@dataclass
class Row:
    """One target: ``value`` must be ``<=`` (or ``<``) ``target``.

    Attributes:
        name: What is measured, as printed.
        value: The measured value (a median).
        target: The bound it is held to.
        unit: Unit of both numbers.
        strict: ``value < target`` instead of ``value <= target``.
        low: Lowest repetition (spread), when repeated.
        high: Highest repetition (spread), when repeated.
        note: What the value was derived from (printed after the verdict).
    """

    name: str
    value: float
    target: float
    unit: str = ""
    strict: bool = False
    low: float | None = None
    high: float | None = None
    note: str = ""
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.passed = self.value < self.target if self.strict else self.value <= self.target

    def line(self) -> str:
        """The printed row: value, spread, target, PASS/FAIL and the margin."""
        op = "<" if self.strict else "<="
        rng = f" [{self.low:.4g}..{self.high:.4g}]" if self.low is not None and self.high is not None else ""
        if self.passed:
            verdict = "PASS"
        else:
            over = self.value - self.target
            rel = f", {over / self.target:+.0%}" if self.target else ""
            verdict = f"FAIL (missed by {over:.4g} {self.unit}{rel})"
        note = f"  ({self.note})" if self.note else ""
        return f"  {self.name:<58} {self.value:>9.4g}{rng} {op} {self.target:g} {self.unit}  {verdict}{note}"


def machine() -> dict[str, Any]:
    """Where and under what load a result was taken (the docs table quotes this)."""
    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover - not on Linux
        load = (float("nan"),) * 3
    import torch

    return {
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime()),
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_avg_1_5_15": [round(x, 2) for x in load],
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def finish(name: str, rows: list[Row], data: dict[str, Any], *, quick: bool, partial: bool = False) -> int:
    """Print the target rows, record results (not in quick mode) and return the exit status.

    Args:
        name: Results go to ``docs/img/bench_<name>.json``.
        rows: The target rows of this script.
        data: Everything else worth plotting (raw samples, per-variant numbers).
        quick: A smoke run: print, but record nothing and never fail on a target.
        partial: Only some parts of the script ran: rows and data of the other parts already in
            the file are kept (each row records the date it was measured), not dropped.
    """
    info = machine()
    print(f"\ntargets ({info['date']}, {info['cpu']}, {info['cores']} cores, load {info['load_avg_1_5_15']}):")
    for row in rows:
        print(row.line())
    if quick:
        print("quick mode: a smoke run, the numbers above are not measurements and no target is enforced")
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"bench_{name}.json"
    records = [{**asdict(r), "date": info["date"]} for r in rows]
    if partial and path.exists():
        previous = json.loads(path.read_text())
        measured = {r.name for r in rows}
        kept = [{"date": previous["machine"]["date"], **r} for r in previous["rows"] if r["name"] not in measured]
        records += kept
        data = {**{k: v for k, v in previous["data"].items() if k not in data}, **data}
    payload = {"machine": info, "rows": records, "data": data}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    missed = [r for r in rows if not r.passed]
    if missed:
        print(f"{len(missed)} of {len(rows)} targets missed: " + "; ".join(r.name for r in missed))
        return 1
    return 0


def child_env(**extra: str) -> dict[str, str]:
    """Environment for benchmark subprocesses: one thread each, so ranks do not fight for cores."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **extra}


def run_quiet(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a benchmark subprocess; on failure show its output (a silent failed worker is undebuggable)."""
    result = subprocess.run(command, capture_output=True, text=True, env=kwargs.pop("env", child_env()), **kwargs)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        msg = f"{' '.join(command[:4])} ... exited with {result.returncode}"
        raise SystemExit(msg)
    return result
