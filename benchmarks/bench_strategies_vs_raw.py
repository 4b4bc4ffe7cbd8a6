"""Every distributed strategy against the same training written by hand in plain PyTorch: step time.

Run:  python benchmarks/bench_strategies_vs_raw.py [--rows fsdp tp ...] [--steps 25 --blocks 8] [--quick]

Each row trains one model two ways on 2 CPU ranks (gloo, OMP_NUM_THREADS=1): the *raw* loop a user
writes with torch (or deepspeed, or torchft) alone, and ``phalanx.Trainer`` with the strategy. Both
run in the same worker processes, in alternating blocks (raw, phalanx, phalanx, raw, ...), so load
from other programs hits both alike. A block is a fresh model trained for ``--steps`` steps; its step
time is the median interval between step starts after ``WARMUP`` steps. Reported per row: the
median over blocks of each side, the ratio phalanx / raw per block pair and its median (target
<= 1.02, wall clock), the same for the mean step, rank 0's CPU time per step and its fastest step,
the load average before and after the row, and, independent of load, the Python calls and the
collectives issued from Python per step on each side (counted over a few steps with
``sys.setprofile``: what phalanx adds, whatever the machine is doing).

Rows (one ``raw_*`` and one ``phalanx_*`` function each, side by side in ``_strategy_rows.py``):

* ``fsdp``: ``fully_shard`` on every block and the root, by hand.
* ``deepspeed_zero2`` / ``deepspeed_zero3``: ``deepspeed.initialize`` with the same config dict
  (DeepSpeed on CPU: ``DS_ACCELERATOR=cpu``).
* ``tp``: ``parallelize_module`` with a column/row-wise plan over 2 ranks, by hand.
* ``pp``: ``PipelineStage`` + ``Schedule1F1B`` over 2 stages, 4 microbatches, by hand.
* ``cp``: context parallel over 2 ranks. torch's ``context_parallel()`` fails on CPU in torch 2.13
  (no sharding strategy for the CPU flash-attention kernels), which is why phalanx does not use it;
  the raw loop does what phalanx does, by hand: each rank keeps two chunks of every sequence, the
  attention (not causal) all-gathers keys and values (autograd-aware), FSDP averages the gradients.
* ``ep``: expert parallel over 2 ranks: a top-2 MoE of 4 stacked experts, 2 per rank, the
  package's ``ExpertParallel`` style applied with ``parallelize_module`` (torch has none of its
  own) and ``fully_shard`` by hand; the row measures what the strategy and the Trainer add.
* ``ft_ddp``: a torchft ``Manager`` with torchft's ``DistributedDataParallel`` and
  ``OptimizerWrapper``, by hand: 2 replica groups of 1 rank, each its own process, joined by a
  lighthouse the harness starts (the cluster layout: ``PHALANX_FT_REPLICA_GROUP``).
* ``ft_diloco``: torchft's ``DiLoCo`` around the same Manager, Adam inside, Nesterov SGD outside,
  a sync every ``SYNC_EVERY`` steps, by hand; same layout as ``ft_ddp``. Its median step is an
  inner step; the mean (printed too) includes the syncs.

The pieces are small on purpose: each raw loop is the whole of what the user would write.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from _bench import Row, child_env, finish
from _strategy_rows import DESCRIPTIONS, QUICK_ROWS, ROWS, WARMUP, counted

__all__ = ["ROWS", "main"]


# ---------------------------------------------------------------- the worker: alternating blocks
def run_worker(row: str, steps: int, blocks: int, out: str) -> None:
    """Alternate raw and phalanx blocks (raw first in even blocks, phalanx first in odd ones)."""
    raw, ours, _ = ROWS[row]
    if not dist.is_initialized() and ROWS[row][2] == "torchrun":
        dist.init_process_group("gloo")  # phalanx's fits reuse this group, as in a torchrun script
    result: dict[str, Any] = {"raw": [], "phalanx": []}
    for block in range(blocks):
        order = (("raw", raw), ("phalanx", ours)) if block % 2 == 0 else (("phalanx", ours), ("raw", raw))
        for side, run in order:
            result[side].append(run(steps))
    result["counted"] = {"raw": counted(raw, WARMUP + 4), "phalanx": counted(ours, WARMUP + 4)}
    rank = dist.get_rank() if ROWS[row][2] == "torchrun" else int(os.environ["PHALANX_FT_REPLICA_GROUP"])
    if rank == 0:
        Path(out, f"{row}.json").write_text(json.dumps(result))


def _exit_now() -> None:
    """Leave without interpreter shutdown once results are written (a gloo thread may abort it: docs/ddp.md)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------- the harness
def _launch(rows: list[str], args: argparse.Namespace, out: str) -> None:
    """One launch of the workers for ``rows`` (torchrun rows only, when several)."""
    me = os.path.abspath(__file__)
    worker = [me, "--role", "worker", "--rows", *rows, "--out", out, "--steps", str(args.steps), "--blocks", str(args.blocks)]  # fmt: skip
    env = child_env(DS_ACCELERATOR="cpu", RUST_LOG="error")
    row = " ".join(rows)
    if ROWS[rows[0]][2] == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *worker]
        _check(subprocess.run(command, env=env, capture_output=True, text=True, timeout=900), row)
        return
    lighthouse = subprocess.Popen(
        [sys.executable, "-m", "phalanx_strategy_torchft.lighthouse", "--bind", "127.0.0.1:0", "--min-replicas", "2",
         "--join-timeout-ms", "1000", "--heartbeat-timeout-ms", "1000"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert lighthouse.stdout is not None
        address = lighthouse.stdout.readline().strip()
        groups = [
            subprocess.Popen(
                [sys.executable, *worker],
                env={**env, "PHALANX_FT_REPLICA_GROUP": str(g), "TORCHFT_LIGHTHOUSE": address},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for g in (0, 1)
        ]
        for g in groups:
            output, _ = g.communicate(timeout=900)
            _check(subprocess.CompletedProcess(g.args, g.returncode, output, ""), row)
    finally:
        lighthouse.terminate()
        lighthouse.wait(30)


def _check(result: subprocess.CompletedProcess[str], row: str) -> None:
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        msg = f"row {row}: the workers exited with {result.returncode}"
        raise SystemExit(msg)


def _block_ms(
    stamps: list[list[float]], clock: int = 0, stat: Callable[[list[float]], float] = statistics.median
) -> float:
    """Interval between step starts after the warm-up, in ms: ``clock`` 0 wall, 1 CPU; median or min."""
    kept = stamps[WARMUP:]
    return 1000 * stat([b[clock] - a[clock] for a, b in itertools.pairwise(kept)])


def _measures(blocks: dict[str, list[list[list[float]]]]) -> dict[str, Any]:
    """Per measure: each side's median over blocks, the ratio per block pair and its median.

    ``wall``: median wall-clock step (the target). ``mean wall``: with the rare steps (ft_diloco's
    syncs) and every disturbance. ``cpu``: median CPU time per step of rank 0 (what load from
    other programs disturbs least). ``fastest cpu``: the step that used the least CPU time (the
    least disturbed one on a shared machine).
    """
    result: dict[str, Any] = {}
    measures = (("wall", 0, statistics.median), ("mean wall", 0, statistics.fmean), ("cpu", 1, statistics.median),
                ("fastest cpu", 1, min))  # fmt: skip
    for name, clock, stat in measures:
        raw = [_block_ms(s, clock, stat) for s in blocks["raw"]]
        ours = [_block_ms(s, clock, stat) for s in blocks["phalanx"]]
        ratios = [o / r for o, r in zip(ours, raw)]
        result[name] = {"raw": statistics.median(raw), "phalanx": statistics.median(ours), "ratios": ratios,
                        "ratio": statistics.median(ratios), "raw_ms": raw, "phalanx_ms": ours}  # fmt: skip
    return result


def main() -> int:
    """Workers run their blocks; the harness launches each row, prints it and the target rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--steps", type=int, default=25, help="steps per block (the first few are warm-up)")
    parser.add_argument("--blocks", type=int, default=8, help="blocks per side (medians are reported)")
    parser.add_argument("--quick", action="store_true", help="one short block per side: proves it runs")
    parser.add_argument("--role", choices=("worker",), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "worker":
        for row in args.rows:
            run_worker(row, args.steps, args.blocks, args.out)
        _exit_now()
    launches = [[row] for row in args.rows]  # a fresh pair of processes per row
    if args.quick:
        args.steps, args.blocks = WARMUP + 3, 1
        if args.rows == list(ROWS):
            args.rows = list(QUICK_ROWS)
        launches = [list(args.rows)] if all(ROWS[r][2] == "torchrun" for r in args.rows) else [[r] for r in args.rows]
    print(f"2 CPU processes, gloo, OMP_NUM_THREADS=1; {args.blocks} blocks per side of {args.steps} steps "
          f"(first {WARMUP} of each block are warm-up)")  # fmt: skip
    rows: list[Row] = []
    data: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as out:
        for launch in launches:
            started, load_before = time.perf_counter(), os.getloadavg()[0]
            _launch(launch, args, out)
            load = (load_before, os.getloadavg()[0])
            rows += _report(launch, out, data, load, time.perf_counter() - started)
    return finish("strategies_vs_raw", rows, data, quick=args.quick, partial=set(args.rows) != set(ROWS))


def _report(launch: list[str], out: str, data: dict[str, Any], load: tuple[float, float], seconds: float) -> list[Row]:
    """Print each row of one launch, record it in ``data``, return its target rows."""
    rows = []
    for row in launch:
        blocks = json.loads(Path(out, f"{row}.json").read_text())
        data[row] = {"timing": _measures(blocks), "per_step": blocks["counted"], "load_1min_before_after": load}
        print(f"  {row} ({seconds:.0f} s, load {load[0]:.1f} -> {load[1]:.1f})")
        for name, m in data[row]["timing"].items():
            shown = ", ".join(f"{x:.3f}" for x in m["ratios"])
            print(f"    {name:<13} raw {m['raw']:7.2f} ms  phalanx {m['phalanx']:7.2f} ms  "
                  f"ratio {m['ratio']:.3f}  (per block pair: {shown})")  # fmt: skip
        for side, c in blocks["counted"].items():
            print(f"    {side:<8} per step: {c['python_calls']:6.0f} Python calls, collectives {c['collectives']}")
        wall, cpu = data[row]["timing"]["wall"], data[row]["timing"]["cpu"]
        rows.append(Row(f"2-rank {DESCRIPTIONS[row]} (wall)", wall["ratio"], 1.02, "x",
                        low=min(wall["ratios"]), high=max(wall["ratios"]),
                        note=f"{wall['raw']:.2f} -> {wall['phalanx']:.2f} ms; CPU time {cpu['ratio']:.3f}; "
                        f"load {load[0]:.1f}-{load[1]:.1f}"))  # fmt: skip
    return rows


if __name__ == "__main__":
    sys.exit(main())
