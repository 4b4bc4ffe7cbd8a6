"""DDP on phalanx vs a hand-written torchrun DDP loop: step time and launch-to-first-step.

Run:  python benchmarks/bench_ddp.py [--steps 60 --width 512 --devices 2 --repeat 5] [--quick]

Everything trains the same MLP on the same data with 2 CPU processes (gloo, OMP_NUM_THREADS=1).

1. Step time. Under ``torchrun``, the same two worker processes alternate, ``--repeat`` times, a
   block of steps of a plain DistributedDataParallel loop and a block of ``Trainer(strategy="ddp")``
   (which reuses the loop's process group). Alternating in the same processes makes load from
   other programs hit both alike. Reported: median wall-clock and CPU step times and the fastest
   step's CPU time (the least disturbed measurement on a shared machine), with their ratios
   (target <= 1.02).
2. Launch-to-first-step: from starting the command to the *slowest* rank's first training step
   (process creation, imports, rendezvous, wrapping), for ``torchrun`` + the plain loop and for a
   plain ``python script.py`` with ``ddp``, ``ddp_spawn`` and ``ddp_fork``; median of
   ``--repeat`` runs, ratio to torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _bench import Row, finish, spread

import phalanx

_WARMUP = 10
_CASES = ("torchrun", "ddp", "ddp_spawn", "ddp_fork")


# ---------------------------------------------------------------- what runs in the ranks
# (bench_ddp_overhead.py imports StampedSteps, _WARMUP, _now, _run and _exit_skipping_shutdown from here)
class StampedSteps:
    """Steps that stamp their start, then MSE on ``self.net``, SGD: mixed into phalanx and Lightning modules."""

    net: Any
    stamps: list[tuple[float, float]]

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.stamps.append(_now())
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=0.01)


class Bench(StampedSteps, phalanx.Module):
    """The benchmark model; at module level so that ddp_spawn can pickle it."""

    def __init__(self, out: str, width: int) -> None:
        super().__init__()
        self.out = out
        self.net = _layers(width)
        self.stamps = []

    def on_train_end(self) -> None:
        self.stamps.append(_now())
        _write(self.out, self.trainer.global_rank, self.stamps)


def _data(width: int, samples: int) -> Any:
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(samples, width, generator=g), torch.randn(samples, 1, generator=g))


def _layers(width: int) -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))


def _now() -> tuple[float, float]:
    """Wall-clock time and this process's CPU time (all its threads, gloo's included)."""
    return time.time(), time.process_time()


def _write(out: str, rank: int, stamps: list[tuple[float, float]]) -> None:
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump({"stamps": stamps}, fh)


def _plain_steps(model: Any, width: int, steps: int) -> list[tuple[float, float]]:
    """``steps`` steps of the hand-written loop on an existing DDP model; returns step start times."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = _data(width, 64 * steps * dist.get_world_size())
    loader = DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset, seed=0))
    stamps: list[tuple[float, float]] = []
    for x, y in loader:
        stamps.append(_now())
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    stamps.append(_now())
    return stamps


def run_plain(out: str, width: int, steps: int) -> None:
    """The reference: what a user writes by hand for torchrun."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    _write(out, dist.get_rank(), _plain_steps(DistributedDataParallel(_layers(width)), width, steps))
    dist.destroy_process_group()


def run_interleaved(out: str, width: int, steps: int, repeat: int, devices: int) -> None:
    """Alternate plain-loop and phalanx blocks in the same torchrun workers (same process group)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    plain_model = DistributedDataParallel(_layers(width))
    plain, ours = [], []
    for _ in range(repeat):
        plain.append(_plain_steps(plain_model, width, steps))
        ours.append(run_phalanx(out, width, steps, "ddp", devices))
    if dist.get_rank() == 0:
        with open(os.path.join(out, "interleaved.json"), "w") as fh:
            json.dump({"plain": plain, "phalanx": ours}, fh)
    dist.destroy_process_group()


def run_phalanx(out: str, width: int, steps: int, strategy: str, devices: int) -> list[tuple[float, float]]:
    """The same training through phalanx's Trainer; returns this process's step start times."""
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    module = Bench(out, width)
    trainer.fit(module, DataLoader(_data(width, 64 * steps * devices), batch_size=64, shuffle=True))
    return module.stamps


def _exit_skipping_shutdown() -> None:
    """End a worker that made its own gloo group, once its results are on disk.

    With torch 2.13, a gloo worker thread that releases a finished collective's tensors after the
    interpreter has begun to shut down aborts the process ("terminate called without an active
    exception"): about 1 run in 10 of a plain DistributedDataParallel script under torchrun. See
    docs/ddp.md, "Your own process group".
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------- the harness
def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)


def _step_ms(blocks: list[list[list[float]]], clock: int = 0, stat: str = "median") -> float:
    """Step time over blocks (``clock`` 0: wall, 1: CPU; ``stat`` "median" or "min"), after warm-up."""
    deltas = [b[clock] - a[clock] for stamps in blocks for a, b in zip(stamps[_WARMUP:], stamps[_WARMUP + 1 :])]
    return 1000 * (min(deltas) if stat == "min" else statistics.median(deltas))


def _launch_seconds(case: str, args: argparse.Namespace) -> float:
    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as out:
        common = ["--out", out, "--width", str(args.width), "--steps", "3"]
        if case == "torchrun":
            launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.devices}"]
            command = [*launch, me, "--role", "plain", *common]
        else:
            command = [
                sys.executable,
                me,
                "--role",
                "phalanx",
                "--strategy",
                case,
                "--devices",
                str(args.devices),
                *common,
            ]
        started = time.time()
        _run(command)
        firsts = [json.loads(Path(out, f"rank{r}.json").read_text())["stamps"][0][0] for r in range(args.devices)]
    return max(firsts) - started


def main() -> int:
    """Workers run their role; the harness prints the tables and the target rows (1 on a miss)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="steps per block in the step-time part")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5, help="blocks / launches per case (medians are reported)")
    parser.add_argument("--cases", nargs="+", default=list(_CASES), choices=_CASES)
    parser.add_argument("--parts", nargs="+", default=["steps", "launch"], choices=("steps", "launch"))
    parser.add_argument("--quick", action="store_true", help="a few steps of the step-time part: proves it runs")
    parser.add_argument("--role", choices=("plain", "phalanx", "interleaved"), help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "plain":
        run_plain(args.out, args.width, args.steps)
        _exit_skipping_shutdown()
    if args.role == "phalanx":
        run_phalanx(args.out, args.width, args.steps, args.strategy, args.devices)
        return 0
    if args.role == "interleaved":
        run_interleaved(args.out, args.width, args.steps, args.repeat, args.devices)
        _exit_skipping_shutdown()
    if args.quick:
        args.steps, args.repeat, args.width, args.parts = _WARMUP + 4, 1, 64, ["steps"]
    print(f"{args.devices} CPU processes, gloo, OMP_NUM_THREADS=1, MLP width {args.width}, batch 64")
    rows: list[Row] = []
    data: dict[str, Any] = {"devices": args.devices, "width": args.width}
    if "steps" in args.parts:
        ratios = _report_steps(args)
        data["step_ratio_per_block"] = ratios
        r = spread(ratios)
        rows.append(Row(f"{args.devices}-rank ddp MLP step-time ratio phalanx / plain DDP (wall)", r.median, 1.02, "x",
                        low=r.low, high=r.high))
    if "launch" in args.parts:
        launches = _report_launches(args)
        data["launch_seconds"] = launches
        if "torchrun" in launches and "ddp" in launches:
            ratio = statistics.median(launches["ddp"]) / statistics.median(launches["torchrun"])
            rows.append(Row("launch-to-first-step, ddp / torchrun (same script)", ratio, 1.0, "x"))
    return finish("ddp", rows, data, quick=args.quick, partial=set(args.parts) != {"steps", "launch"})


def _report_steps(args: argparse.Namespace) -> list[float]:
    with tempfile.TemporaryDirectory() as out:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.devices}"]
        common = ["--width", str(args.width), "--steps", str(args.steps), "--repeat", str(args.repeat)]
        _run(
            [
                *launch,
                os.path.abspath(__file__),
                "--role",
                "interleaved",
                "--out",
                out,
                "--devices",
                str(args.devices),
                *common,
            ]
        )
        blocks = json.loads(Path(out, "interleaved.json").read_text())
    print(f"\nstep time, {args.repeat} alternating blocks of {args.steps} steps in the same torchrun workers")
    for clock, stat, name in (
        (0, "median", "median wall-clock"),
        (1, "median", "median CPU time  "),
        (1, "min", "fastest step, CPU"),
    ):
        plain, ours = _step_ms(blocks["plain"], clock, stat), _step_ms(blocks["phalanx"], clock, stat)
        print(f"  {name}  plain DDP loop {plain:7.2f} ms   phalanx ddp {ours:7.2f} ms   ratio {ours / plain:.3f}x")
    pairs = [_step_ms([o]) / _step_ms([p]) for p, o in zip(blocks["plain"], blocks["phalanx"])]
    shown = ", ".join(f"{r:.2f}" for r in pairs)
    print(f"  median wall-clock ratio per block pair (their spread is the noise of the machine): {shown}")
    return pairs


def _report_launches(args: argparse.Namespace) -> dict[str, list[float]]:
    launches: dict[str, list[float]] = {case: [] for case in args.cases}
    for _ in range(args.repeat):  # interleaved, so machine load hits every case alike
        for case in args.cases:
            launches[case].append(_launch_seconds(case, args))
    medians = {case: statistics.median(times) for case, times in launches.items()}
    base = medians.get("torchrun")
    print(f"\nlaunch-to-first-step (command start -> slowest rank's first step), median of {args.repeat}")
    for case, seconds in medians.items():
        ratio = f"{seconds / base:.2f}x torchrun" if base else ""
        print(f"  {case:<10} {seconds:8.2f} s   {ratio}")
    return launches


if __name__ == "__main__":
    sys.exit(main())
