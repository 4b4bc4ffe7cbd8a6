"""DDP on phalanx vs a hand-written torchrun DDP loop: step time and launch-to-first-step.

Run:  python benchmarks/bench_ddp.py [--steps 80 --width 512 --devices 2 --repeat 3]

Each case trains the same MLP on the same data with 2 CPU processes (gloo, OMP_NUM_THREADS=1):

- ``torchrun``: ``python -m torch.distributed.run`` + a plain DistributedDataParallel loop;
- ``ddp``, ``ddp_spawn``, ``ddp_fork``: ``Trainer(strategy=...)`` launched as a plain script.

Measured on every rank: the wall-clock time at which its first training step starts and the time
of every step. Reported: launch-to-first-step (from starting the command to the *slowest* rank's
first step: process creation, imports, rendezvous, model wrapping) and the median step time after
a warm-up, each with its ratio to torchrun. Target (issue #4): step-time ratio <= 1.02.
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

import phalanx

_WARMUP = 10
_CASES = ("torchrun", "ddp", "ddp_spawn", "ddp_fork")


# ---------------------------------------------------------------- what runs in the ranks
class Bench(phalanx.Module):
    """The benchmark model; at module level so that ddp_spawn can pickle it."""

    def __init__(self, out: str, width: int) -> None:
        super().__init__()
        self.out = out
        self.net = _layers(width)
        self.stamps: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.stamps.append(time.time())
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self) -> None:
        _write(self.out, self.trainer.global_rank, [*self.stamps, time.time()])


def _data(width: int, samples: int) -> Any:
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(samples, width, generator=g), torch.randn(samples, 1, generator=g))


def _layers(width: int) -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))


def _write(out: str, rank: int, stamps: list[float]) -> None:
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump({"stamps": stamps}, fh)


def run_plain(out: str, width: int, steps: int) -> None:
    """The reference: what a user writes by hand for torchrun."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(_layers(width))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = _data(width, 64 * steps * dist.get_world_size())
    loader = DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset, seed=0))
    stamps = []
    for x, y in loader:
        stamps.append(time.time())
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    stamps.append(time.time())
    _write(out, dist.get_rank(), stamps)
    dist.destroy_process_group()


def run_phalanx(out: str, width: int, steps: int, strategy: str, devices: int) -> None:
    """The same training through phalanx's Trainer."""
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
    trainer.fit(Bench(out, width), DataLoader(_data(width, 64 * steps * devices), batch_size=64, shuffle=True))


# ---------------------------------------------------------------- the harness
def _measure(case: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        me = os.path.abspath(__file__)
        common = ["--out", out, "--width", str(args.width), "--steps", str(args.steps)]
        if case == "torchrun":
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={args.devices}",
                me,
                "--role",
                "plain",
                *common,
            ]
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
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        started = time.time()
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text())["stamps"] for r in range(args.devices)]
    first = max(stamps[0] for stamps in ranks)
    steps = [b - a for stamps in ranks for a, b in zip(stamps[_WARMUP:], stamps[_WARMUP + 1 :])]
    return {"launch_s": first - started, "step_ms": 1000 * statistics.median(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (medians are reported)")
    parser.add_argument("--cases", nargs="+", default=list(_CASES), choices=_CASES)
    parser.add_argument("--role", choices=("plain", "phalanx"), help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "plain":
        run_plain(args.out, args.width, args.steps)
        return
    if args.role == "phalanx":
        run_phalanx(args.out, args.width, args.steps, args.strategy, args.devices)
        return
    # Interleave the cases and keep each one's median, so that load from other programs on the
    # machine hits every case alike.
    runs: dict[str, list[dict[str, float]]] = {case: [] for case in args.cases}
    for _ in range(args.repeat):
        for case in args.cases:
            runs[case].append(_measure(case, args))
    results = {case: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for case, rs in runs.items()}
    base = results.get("torchrun")
    print(
        f"{args.devices} CPU processes, gloo, MLP width {args.width}, {args.steps} steps of batch 64, median of {args.repeat}"
    )
    print(f"{'launch':<10} {'launch-to-first-step s':>23} {'vs torchrun':>12} {'step ms':>9} {'vs torchrun':>12}")
    for case, r in results.items():
        launch_ratio = f"{r['launch_s'] / base['launch_s']:.2f}x" if base else "-"
        step_ratio = f"{r['step_ms'] / base['step_ms']:.3f}x" if base else "-"
        print(f"{case:<10} {r['launch_s']:>23.2f} {launch_ratio:>12} {r['step_ms']:>9.2f} {step_ratio:>12}")


if __name__ == "__main__":
    main()
