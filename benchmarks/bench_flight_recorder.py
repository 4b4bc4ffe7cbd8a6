"""What torch's flight recorder costs, on by default in phalanx's distributed stages.

Run:  python benchmarks/bench_flight_recorder.py [--steps 600 --repeat 3] [--quick]

The recorder is read once per process, when the first process group is made, so on and off are
separate torchrun launches (2 ranks, gloo), alternating (on, off, off, on, ...). Each launch trains
the tiny model of bench_ddp_overhead.py with ``Trainer(strategy="ddp")``, then ``"fsdp"`` (a step
is almost all Python and a few gloo collectives, so a per-collective cost shows as much as it can)
and times 200 ``strategy.reduce`` calls after each fit (bench_hang_checks.py's measurement). "on" is
phalanx's default (``TORCH_FR_BUFFER_SIZE`` unset: phalanx sets 2000); "off" sets it to 0.

Reported: microseconds per step and per collective, medians over launches, and the step-time ratio
on / off. Recording captures each collective's Python stack: that is the cost, per collective,
whatever the buffer size; a real step (milliseconds to seconds) hides it, the tiny step shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _bench import Row, finish
from bench_ddp import _WARMUP, _run
from bench_ddp_overhead import TinyBench, _tiny_data
from bench_hang_checks import _TimeReduces

import phalanx

MODES = ("on", "off")
#: ddp: one gradient all-reduce per step; fsdp: an all-gather per forward and backward and a
#: reduce-scatter per step (more collectives, deeper stacks to capture).
STRATEGIES = ("ddp", "fsdp")


def _fit(strategy: str, steps: int) -> tuple[float, float]:
    """(microseconds per step, per strategy.reduce) of one fit of the tiny model (the defaults)."""
    from torch.utils.data import DataLoader

    timer = _TimeReduces()
    trainer = phalanx.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
    )  # fmt: skip
    module = TinyBench()
    trainer.fit(module, DataLoader(_tiny_data(steps, 2), batch_size=8, shuffle=True))
    stamps = module.stamps
    (w0, _), (w1, _) = stamps[_WARMUP], stamps[-1]
    return 1e6 * (w1 - w0) / (len(stamps) - 1 - _WARMUP), timer.per_call_us


def run_worker(out: str, steps: int, mode: str, index: int) -> None:
    for strategy in STRATEGIES:
        step_us, reduce_us = _fit(strategy, steps)
        if int(os.environ.get("RANK", "0")) == 0:
            Path(out, f"{strategy}-{mode}-{index}.json").write_text(
                json.dumps({"step_us": step_us, "reduce_us": reduce_us})
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="steps per launch")
    parser.add_argument("--repeat", type=int, default=3, help="launches per mode (medians are reported)")
    parser.add_argument("--quick", action="store_true", help="a few steps, one launch each: proves it runs")
    parser.add_argument("--role", choices=("worker",), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "worker":
        run_worker(args.out, args.steps, args.mode, args.index)
        return 0
    if args.quick:
        args.steps, args.repeat = _WARMUP + 10, 1
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    results: dict[str, dict[str, list[dict[str, float]]]] = {st: {mode: [] for mode in MODES} for st in STRATEGIES}
    with tempfile.TemporaryDirectory() as out:
        for index in range(args.repeat):
            for mode in MODES if index % 2 == 0 else MODES[::-1]:
                if mode == "off":
                    os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
                else:
                    os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
                worker = [os.path.abspath(__file__), "--role", "worker", "--out", out, "--steps", str(args.steps)]
                _run([*launch, *worker, "--mode", mode, "--index", str(index)])
                for strategy in STRATEGIES:
                    results[strategy][mode].append(json.loads(Path(out, f"{strategy}-{mode}-{index}.json").read_text()))
    os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    print(f"2 CPU processes, gloo, tiny model, {args.repeat} launches per mode of {args.steps} steps")
    rows, data = [], {}
    for strategy in STRATEGIES:
        medians = {mode: {key: statistics.median(r[key] for r in runs) for key in ("step_us", "reduce_us")}
                   for mode, runs in results[strategy].items()}  # fmt: skip
        for mode, m in medians.items():
            print(
                f"  {strategy:<5} recorder {mode:<4} {m['step_us']:8.1f} us/step   {m['reduce_us']:8.1f} us per collective"
            )
        per_collective = medians["on"]["reduce_us"] - medians["off"]["reduce_us"]
        ratio = medians["on"]["step_us"] / medians["off"]["step_us"]
        print(f"  {strategy}: {per_collective:+.1f} us per strategy collective; step time on / off = {ratio:.3f}")
        on_steps = [r["step_us"] for r in results[strategy]["on"]]
        rows.append(
            Row(
                f"2-rank {strategy}, tiny model: step time with the flight recorder / without",
                ratio,
                1.02,
                "x",
                low=min(on_steps) / medians["off"]["step_us"],
                high=max(on_steps) / medians["off"]["step_us"],
                note=f"{medians['on']['step_us'] - medians['off']['step_us']:+.0f} us/step on "
                f"{medians['off']['step_us']:.0f} us; {per_collective:+.1f} us per strategy.reduce",
            )
        )
        data[strategy] = {"medians": medians, "samples": results[strategy], "per_collective_us": per_collective}
    return finish("flight_recorder", rows, data, quick=args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
