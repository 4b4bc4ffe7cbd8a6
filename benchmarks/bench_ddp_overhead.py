"""2-rank ddp per-step overhead on a framework-bound model: plain DDP vs phalanx vs Lightning.

Run:  python benchmarks/bench_ddp_overhead.py [--steps 1000 --repeat 5 --devices 2] [--quick]

The tiny model (Linear 32->32->4, batch 8; a step is almost all Python and one gloo all-reduce)
is trained under ``torchrun`` by the plain DistributedDataParallel loop, ``Trainer(strategy="ddp")``
and, when ``pytorch_lightning`` is installed (``nox -s bench`` installs it), Lightning's
``Trainer(strategy="ddp")``. The three alternate ``--repeat`` times in the same workers (the order
rotates), so load from other programs hits them alike. Reported: microseconds per step over the
plain loop, paired per repetition, and phalanx's overhead as a fraction of Lightning's (target
<= 0.1). On 2 shared cores a 2.5 ms gloo step varies by about 200 us between blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from _bench import Row, finish
from bench_ddp import _WARMUP, StampedSteps, _exit_skipping_shutdown, _now, _run

import phalanx

_TINY = ((32, 32, 4), 8)  # layer widths and batch size, as in bench_trainer_overhead.py


def _tiny_net() -> Any:
    from torch import nn

    (a, b, c), _ = _TINY
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c))


def _tiny_data(steps: int, world: int) -> Any:
    from torch.utils.data import TensorDataset

    (a, _, c), batch = _TINY
    g = torch.Generator().manual_seed(0)
    n = batch * steps * world
    return TensorDataset(torch.randn(n, a, generator=g), torch.randn(n, c, generator=g))


class _TinySteps(StampedSteps):
    """The tiny model, the same under phalanx and Lightning; stamps each step's start."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _tiny_net()
        self.stamps = []


class TinyBench(_TinySteps, phalanx.Module):
    """The tiny model under phalanx."""


def _tiny_plain(steps: int) -> list[tuple[float, float]]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    model = DistributedDataParallel(_tiny_net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = _tiny_data(steps, dist.get_world_size())
    stamps: list[tuple[float, float]] = []
    for x, y in DataLoader(dataset, batch_size=_TINY[1], sampler=DistributedSampler(dataset, seed=0)):
        stamps.append(_now())
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    stamps.append(_now())
    return stamps


def _tiny_phalanx(steps: int, devices: int) -> list[tuple[float, float]]:
    from torch.utils.data import DataLoader

    trainer = phalanx.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp", max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False,
    )
    module = TinyBench()
    trainer.fit(module, DataLoader(_tiny_data(steps, devices), batch_size=_TINY[1], shuffle=True))
    return module.stamps


def _tiny_lightning(steps: int, devices: int) -> list[tuple[float, float]]:
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    class LitTiny(_TinySteps, pl.LightningModule):
        """The tiny model under Lightning."""

    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp", max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    module = LitTiny()
    trainer.fit(module, DataLoader(_tiny_data(steps, devices), batch_size=_TINY[1], shuffle=True))
    return module.stamps


def _lightning_installed() -> bool:
    try:
        import pytorch_lightning  # noqa: F401
    except ImportError:
        return False
    import logging
    import warnings

    warnings.filterwarnings("ignore")  # Lightning's "no workers" advice would flood the workers' output
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return True


def run_tiny(out: str, steps: int, repeat: int, devices: int) -> None:
    """Alternate the tiny model's plain / phalanx / Lightning blocks in the same torchrun workers."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    runners = {"plain": lambda: _tiny_plain(steps), "phalanx": lambda: _tiny_phalanx(steps, devices)}
    if _lightning_installed():
        runners["lightning"] = lambda: _tiny_lightning(steps, devices)
    names = list(runners)
    blocks: dict[str, list[list[tuple[float, float]]]] = {name: [] for name in names}
    for index in range(repeat):
        for name in names[index % len(names) :] + names[: index % len(names)]:  # rotate the order
            blocks[name].append(runners[name]())
    if dist.get_rank() == 0:
        with open(os.path.join(out, "tiny.json"), "w") as fh:
            json.dump(blocks, fh)
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- the harness
def _report(args: argparse.Namespace) -> dict[str, list[float]]:
    """Per-step overhead (us) of phalanx and Lightning over the plain DDP loop, paired per repetition."""
    with tempfile.TemporaryDirectory() as out:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.devices}"]
        common = ["--steps", str(args.steps), "--repeat", str(args.repeat), "--devices", str(args.devices)]
        _run([*launch, os.path.abspath(__file__), "--role", "tiny", "--out", out, *common])
        blocks = json.loads(Path(out, "tiny.json").read_text())

    def per_step_us(stamps: list[list[float]]) -> float:
        (w0, _), (w1, _) = stamps[_WARMUP], stamps[-1]
        return 1e6 * (w1 - w0) / (len(stamps) - 1 - _WARMUP)

    times = {name: [per_step_us(b) for b in runs] for name, runs in blocks.items()}
    overhead = {name: [t - p for t, p in zip(runs, times["plain"])] for name, runs in times.items() if name != "plain"}
    print(f"\ntiny model (Linear 32->32->4, batch 8), {args.repeat} alternating blocks of {args.steps} steps")
    for name, runs in times.items():
        extra = f"   overhead {statistics.median(overhead[name]):7.1f} us" if name in overhead else ""
        print(f"  {name:<10} {statistics.median(runs):8.1f} us/step (median of blocks){extra}")
    if "lightning" not in overhead:
        print("  (pytorch_lightning is not installed: no Lightning rows; `nox -s bench` installs it)")
    return overhead


def main() -> int:
    """Workers run their role; the harness prints the table and the target row (1 on a miss)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps per block")
    parser.add_argument("--repeat", type=int, default=5, help="alternating blocks per loop (medians are reported)")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a few steps, one block: proves it runs")
    parser.add_argument("--role", choices=("tiny",), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "tiny":
        run_tiny(args.out, args.steps, args.repeat, args.devices)
        _exit_skipping_shutdown()
    if args.quick:
        args.steps, args.repeat = _WARMUP + 10, 1
    print(f"{args.devices} CPU processes, gloo, OMP_NUM_THREADS=1")
    overhead = _report(args)
    rows: list[Row] = []
    if overhead.get("lightning"):
        ours, theirs = statistics.median(overhead["phalanx"]), statistics.median(overhead["lightning"])
        rows.append(Row(f"{args.devices}-rank ddp tiny-model per-step overhead, phalanx / Lightning (wall)",
                        ours / theirs, 0.1, "x", note=f"{ours:.0f} us vs {theirs:.0f} us over plain DDP"))
    return finish("ddp_overhead", rows, {"devices": args.devices, "overhead_us": overhead}, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
