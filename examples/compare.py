"""``examples/demo.py --compare``: the same model under several strategies, one table.

Each strategy runs ``demo.py`` in a fresh process (``ddp`` re-executes the script once per rank, so
a run must own its process) with the same *global* batch: 16 windows split over the processes.
Shuffling and dropout are off, so every strategy sees the same batches and computes the same
function, and the final losses must agree; the table shows how closely they do.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["compare"]

DEFAULT = ["single_device", "ddp", "fsdp"]
#: Largest difference in final loss between strategies that still counts as agreeing. Reduction
#: order differs between one process and an all-reduce, and AdamW carries the difference along.
TOLERANCE = 0.02


def _processes(strategy: str, devices: int) -> int:
    from phalanx.registry import StrategyRegistry
    from phalanx.strategies import ParallelStrategy

    return devices if issubclass(StrategyRegistry.get_class(strategy), ParallelStrategy) else 1


def _run(script: Path, strategy: str, processes: int, args: argparse.Namespace, report: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        str(script),
        "--strategy",
        strategy,
        "--devices",
        str(processes),
        "--accelerator",
        args.accelerator,
        "--precision",
        args.precision,
        "--max-steps",
        str(args.max_steps),
        "--batch-size",
        str(args.batch_size // processes),
        "--seed",
        str(args.seed),
        "--dropout",
        "0",
        "--no-shuffle",
        "--no-progress-bar",
        "--root-dir",
        str(report.parent),
        "--report",
        str(report),
    ]
    report.parent.mkdir(parents=True, exist_ok=True)
    print(f"\n== {strategy}: {processes} process{'es' if processes > 1 else ''}", flush=True)
    start = time.perf_counter()
    result = subprocess.run(command, timeout=900, start_new_session=True, check=False)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        msg = f"the {strategy} run exited with code {result.returncode}; its output is above. Fix it, or leave {strategy} out of --compare"
        raise RuntimeError(msg)
    ranks = [json.loads(Path(f"{report}.rank{r}.json").read_text()) for r in range(processes)]
    return {"strategy": strategy, "processes": processes, "wall": wall, "ranks": ranks}


def _table(rows: list[dict[str, Any]]) -> list[str]:
    header = ["strategy", "processes", "train loss", "val loss", "wall time (incl. start-up)", "peak memory per rank"]
    cells = [
        [
            row["strategy"],
            str(row["processes"]),
            f"{row['ranks'][0]['train_loss']:.4f}",
            f"{row['ranks'][0]['val_loss']:.4f}",
            f"{row['wall']:.1f} s",
            " / ".join(f"{rank['peak_memory_mb']:.0f}" for rank in row["ranks"]) + " MB",
        ]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in [header, *cells]]


def compare(script: Path, args: argparse.Namespace) -> int:
    """Run ``script`` under each strategy of ``args.compare``; print the table; 1 if losses disagree."""
    strategies = args.compare or DEFAULT
    devices = int(args.devices) if str(args.devices).isdigit() and int(args.devices) > 1 else 2
    print(
        f"phalanx demo --compare: {', '.join(strategies)}; {args.max_steps} steps, global batch {args.batch_size}, "
        "no shuffling, no dropout",
        flush=True,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="phalanx-demo-") as tmp:
        rows = [
            _run(script, name, _processes(name, devices), args, Path(tmp) / name / "report") for name in strategies
        ]
    print()
    print("\n".join(_table(rows)))
    spreads = {}
    for key in ("train_loss", "val_loss"):
        values = [row["ranks"][0][key] for row in rows]
        spreads[key] = max(values) - min(values) if all(math.isfinite(v) for v in values) else math.inf
    agree = all(spread <= TOLERANCE for spread in spreads.values())
    print(
        f"\nlargest difference between strategies: train {spreads['train_loss']:.4f}, val {spreads['val_loss']:.4f} "
        f"({'agree' if agree else 'DISAGREE'}: tolerance {TOLERANCE}); total {time.perf_counter() - started:.0f} s"
    )
    return 0 if agree else 1
