"""What the hang defences cost: the watchdog per step, the collective agreement check per collective.

Run:  python benchmarks/bench_hang_checks.py [--steps 600 --repeat 5] [--quick]

Two ranks under ``torchrun`` train the tiny model of bench_ddp_overhead.py (a step is almost all
Python and one gloo all-reduce, so any per-step cost shows) with ``Trainer(strategy="ddp")`` in
three variants, alternating in the same workers (the order rotates): the defaults (watchdog on),
``hang_report_after=None`` (no watchdog thread) and ``PHALANX_DISTRIBUTED_DEBUG=1`` (every
strategy collective checked first). After each fit, 200 ``trainer.strategy.reduce`` calls are
timed, and so is one watchdog check (what its thread does once a second). Reported: microseconds
per step, per reduce and per check, medians over blocks. The target row is the watchdog's share of
a rank's time, its check's cost once a second (target <= 0.002); the wall-clock A/B of steps with
and without it is printed too, but on a shared 2-core machine its spread between blocks is larger
than the effect (both watchdog-on variants count there: the tiny model issues no strategy
collective per step). The check's cost is reported, not targeted: it is a debugging switch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _bench import Row, finish
from bench_ddp import _WARMUP, _run
from bench_ddp_overhead import TinyBench, _tiny_data

import phalanx

VARIANTS = ("watchdog", "no_watchdog", "agreement_check")
_REDUCES = 200


class _TimeReduces(phalanx.Callback):
    """After training (every rank): time ``strategy.reduce`` of a one-element tensor, and one
    watchdog check (what its thread does once a second: read the counters, ask the store)."""

    def __init__(self) -> None:
        self.per_call_us = 0.0
        self.check_us = 0.0

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        watchdog = trainer.run.watchdog
        if watchdog is not None:
            start = time.perf_counter()
            for _ in range(_REDUCES):
                watchdog.check(time.monotonic())
            self.check_us = 1e6 * (time.perf_counter() - start) / _REDUCES
        tensor = torch.ones(1)
        trainer.strategy.barrier()
        start = time.perf_counter()
        for _ in range(_REDUCES):
            trainer.strategy.reduce(tensor)
        self.per_call_us = 1e6 * (time.perf_counter() - start) / _REDUCES


def _fit(variant: str, steps: int) -> tuple[float, float, float]:
    from torch.utils.data import DataLoader

    os.environ["PHALANX_DISTRIBUTED_DEBUG"] = "1" if variant == "agreement_check" else "0"
    timer = _TimeReduces()
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
        hang_report_after=None if variant == "no_watchdog" else 60.0,
    )
    module = TinyBench()
    trainer.fit(module, DataLoader(_tiny_data(steps, 2), batch_size=8, shuffle=True))
    stamps = module.stamps
    (w0, _), (w1, _) = stamps[_WARMUP], stamps[-1]
    return 1e6 * (w1 - w0) / (len(stamps) - 1 - _WARMUP), timer.per_call_us, timer.check_us


def run_worker(out: str, steps: int, repeat: int) -> None:
    results: dict[str, dict[str, list[float]]] = {v: {"step_us": [], "reduce_us": [], "check_us": []} for v in VARIANTS}
    for index in range(repeat):
        order = VARIANTS[index % len(VARIANTS) :] + VARIANTS[: index % len(VARIANTS)]
        for variant in order:
            step_us, reduce_us, check_us = _fit(variant, steps)
            results[variant]["step_us"].append(step_us)
            results[variant]["reduce_us"].append(reduce_us)
            results[variant]["check_us"].append(check_us)
    if int(os.environ.get("RANK", "0")) == 0:
        Path(out, "hang_checks.json").write_text(json.dumps(results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="steps per block")
    parser.add_argument("--repeat", type=int, default=5, help="alternating blocks per variant (medians are reported)")
    parser.add_argument("--quick", action="store_true", help="a few steps, one block: proves it runs")
    parser.add_argument("--role", choices=("worker",), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "worker":
        run_worker(args.out, args.steps, args.repeat)
        return 0
    if args.quick:
        args.steps, args.repeat = _WARMUP + 10, 1
    with tempfile.TemporaryDirectory() as out:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        _run(
            [
                *launch,
                os.path.abspath(__file__),
                "--role",
                "worker",
                "--out",
                out,
                "--steps",
                str(args.steps),
                "--repeat",
                str(args.repeat),
            ]
        )
        results = json.loads(Path(out, "hang_checks.json").read_text())
    medians = {v: {k: statistics.median(values) for k, values in r.items()} for v, r in results.items()}
    print(f"2 CPU processes, gloo, tiny model, {args.repeat} alternating blocks of {args.steps} steps")
    for variant, m in medians.items():
        print(f"  {variant:<16} {m['step_us']:8.1f} us/step   {m['reduce_us']:8.1f} us per strategy.reduce")
    # The agreement-check variant runs the watchdog too (and no strategy collective per step here):
    # both count as "watchdog on", which halves the noise of a loaded machine.
    on = statistics.median(results["watchdog"]["step_us"] + results["agreement_check"]["step_us"])
    off = medians["no_watchdog"]["step_us"]
    watchdog_cost = on - off
    check_cost = medians["agreement_check"]["reduce_us"] - medians["watchdog"]["reduce_us"]
    print(f"  watchdog: {watchdog_cost:+.1f} us/step; agreement check: {check_cost:+.1f} us per collective")
    check_us = medians["watchdog"]["check_us"]
    print(f"  one watchdog check (its thread makes one a second): {check_us:.1f} us")
    rows = [
        Row(
            "2-rank ddp: the watchdog's share of a rank's time (one check a second; the thread's own cost)",
            check_us / 1e6,
            0.002,
            "x",
            note=f"{check_us:.0f} us a second; wall A/B on the tiny model {watchdog_cost:+.0f} us/step on {off:.0f} us "
            "(within the blocks' spread)",
        ),
    ]
    data = {"medians": medians, "samples": results, "check_cost_us": check_cost}
    return finish("hang_checks", rows, data, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
