"""Per-step cost of phalanx's Trainer against a plain PyTorch loop and Lightning, one process.

    python benchmarks/bench_trainer_overhead.py            # 5 interleaved repetitions of everything
    python benchmarks/bench_trainer_overhead.py --quick    # smoke run: a few steps, nothing enforced

Two models, each trained by three loops on the same DataLoader and optimizer (SGD):

- *tiny* (Linear 32->32->4, batch 8): so small that the step is almost all Python, which makes the
  framework's own per-step work visible. Reported as overhead in microseconds over the plain loop;
- *mlp* (256->1024->1024->10, batch 64): compute-bound, reported as the step-time ratio to plain.

Each step stamps wall and CPU time at its start (inside ``training_step`` for the Trainers), and a
run's step time is the time from the first stamp after warm-up to the last, over the steps between:
setup and teardown are excluded alike. Repetitions alternate the loops (the order rotates each
time) so a noisy neighbour hits all of them; the overhead of a repetition is paired against the
plain loop of the same repetition, and the median and range over repetitions are reported. The
deterministic companion is the per-step Python call count (``sys.setprofile``), printed for every
loop: it does not depend on machine load. Lightning rows appear when ``pytorch_lightning`` is
importable (``nox -s bench`` installs it); phalanx never depends on it.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from _bench import Row, finish, pin_threads, spread

pin_threads()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import phalanx  # noqa: E402

#: model name -> (layer widths, batch size)
MODELS = {"tiny": ((32, 32, 4), 8), "mlp": ((256, 1024, 1024, 10), 64)}
Stamps = list[tuple[float, float]]


def _net(widths: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _loader(widths: tuple[int, ...], batch: int, steps: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = batch * steps
    return DataLoader(
        TensorDataset(torch.randn(n, widths[0], generator=g), torch.randn(n, widths[-1], generator=g)), batch_size=batch
    )


def _stamp(stamps: Stamps) -> None:
    stamps.append((time.perf_counter(), time.process_time()))


def plain(widths: tuple[int, ...], data: DataLoader, stamps: Stamps) -> None:
    """What a user writes by hand."""
    net = _net(widths)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    net.train()
    for x, y in data:
        _stamp(stamps)
        optimizer.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()


class _PhalanxNet(phalanx.Module):
    def __init__(self, widths: tuple[int, ...], stamps: Stamps) -> None:
        super().__init__()
        self.net = _net(widths)
        self.stamps = stamps

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _stamp(self.stamps)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run_phalanx(widths: tuple[int, ...], data: DataLoader, stamps: Stamps) -> None:
    """The same training through ``phalanx.Trainer`` with everything optional switched off."""
    trainer = phalanx.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(_PhalanxNet(widths, stamps), data)


def run_lightning(widths: tuple[int, ...], data: DataLoader, stamps: Stamps) -> None:
    """The same training through ``pytorch_lightning.Trainer``, configured like the phalanx run."""
    import pytorch_lightning as pl

    class LitNet(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net(widths)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            _stamp(stamps)
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LitNet(), data)


def lightning_available() -> bool:
    """Whether the comparison rows can run (pytorch_lightning importable)."""
    try:
        import pytorch_lightning  # noqa: F401
    except ImportError:
        return False
    import logging

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    return True


def per_step(stamps: Stamps, warmup: int) -> tuple[float, float]:
    """Seconds per step (wall, CPU) between the first stamp after ``warmup`` and the last."""
    (w0, c0), (w1, c1) = stamps[warmup], stamps[-1]
    n = len(stamps) - 1 - warmup
    return (w1 - w0) / n, (c1 - c0) / n


def calls_per_step(loop: Callable[..., None], widths: tuple[int, ...], batch: int, steps: int) -> float:
    """Python function calls per step, counted (not timed): the difference of two run lengths."""

    def count(n: int) -> int:
        total = 0

        def profile(frame: Any, event: str, arg: Any) -> None:
            nonlocal total
            if event == "call":
                total += 1

        data = _loader(widths, batch, n)
        sys.setprofile(profile)
        try:
            loop(widths, data, [])
        finally:
            sys.setprofile(None)
        return total

    return (count(2 * steps) - count(steps)) / steps


def main() -> int:
    """Run, print the table and the target rows; 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="steps per run of the tiny model (mlp: a tenth)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved repetitions (at least 5 for the record)")
    parser.add_argument("--quick", action="store_true", help="a few steps, 1 repetition: proves the script runs")
    parser.add_argument("--no-lightning", action="store_true", help="skip the Lightning comparison")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeat = 40, 1
    warnings.filterwarnings("ignore")  # Lightning's "no workers" advice would interleave the table
    loops: dict[str, Callable[..., None]] = {"plain": plain, "phalanx": run_phalanx}
    if not args.no_lightning and lightning_available():
        loops["lightning"] = run_lightning
    steps = {"tiny": args.steps, "mlp": max(args.steps // 10, 20)}
    results: dict[str, dict[str, list[tuple[float, float]]]] = {m: {v: [] for v in loops} for m in MODELS}
    for widths, batch in MODELS.values():  # warm-up: lazy imports, allocator, kernels
        for loop in loops.values():
            loop(widths, _loader(widths, batch, 20), [])
    names = list(loops)
    for rep in range(args.repeat):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for model, (widths, batch) in MODELS.items():
            for name in order:
                stamps: Stamps = []
                data = _loader(widths, batch, steps[model] + 1)
                gc.collect()
                loops[name](widths, data, stamps)
                results[model][name].append(per_step(stamps, warmup=max(steps[model] // 20, 2)))
    counts = {
        name: calls_per_step(loop, *MODELS["tiny"], steps=50 if args.quick else 200) for name, loop in loops.items()
    }
    return report(args, results, counts)


def report(args: argparse.Namespace, results: dict[str, Any], counts: dict[str, float]) -> int:
    """Print the per-loop table and the target rows."""
    print(f"one process, 1 thread, SGD; {args.repeat} interleaved repetitions (median [min..max])")
    data: dict[str, Any] = {"calls_per_step_tiny": counts, "runs": results, "repeat": args.repeat}
    rows: list[Row] = []
    tiny, mlp = results["tiny"], results["mlp"]
    print(f"{'loop':<11}{'tiny us/step wall':>28}{'tiny us/step cpu':>28}{'mlp ms/step wall':>26}{'calls/step':>12}")
    for name in tiny:
        tw, tc = (spread([r[i] * 1e6 for r in tiny[name]]) for i in (0, 1))
        mw = spread([r[0] * 1e3 for r in mlp[name]])
        print(f"{name:<11}{tw!s:>28}{tc!s:>28}{mw!s:>26}{counts[name]:>12.1f}")
    overhead: dict[str, dict[str, Any]] = {}
    for name in tiny:
        if name == "plain":
            continue
        for clock, label in ((0, "wall"), (1, "cpu")):
            diffs = [(o[clock] - p[clock]) * 1e6 for o, p in zip(tiny[name], tiny["plain"])]
            overhead.setdefault(name, {})[label] = spread(diffs)
        ratios = [o[0] / p[0] for o, p in zip(mlp[name], mlp["plain"])]
        overhead[name]["mlp_ratio"] = spread(ratios)
    print("\nper-step overhead over the plain loop, tiny model (paired within each repetition):")
    for name, o in overhead.items():
        print(f"  {name:<10} wall {o['wall']!s:<34} cpu {o['cpu']!s:<34} mlp ratio {o['mlp_ratio']}")
    data["overhead_us"] = {n: {k: vars(v) for k, v in o.items()} for n, o in overhead.items()}
    ours = overhead["phalanx"]
    cpu = ours["cpu"]
    rows.append(
        Row(
            "tiny model per-step overhead, phalanx - plain (CPU time)",
            cpu.median,
            20.0,
            "us",
            low=cpu.low,
            high=cpu.high,
            note=f"wall {ours['wall'].median:.1f} us",
        )
    )
    ratio = ours["mlp_ratio"]
    rows.append(
        Row("MLP step-time ratio phalanx / plain (wall)", ratio.median, 1.02, "x", low=ratio.low, high=ratio.high)
    )
    if "lightning" in overhead:
        lit = overhead["lightning"]["cpu"].median
        share = cpu.median / lit if lit > 0 else float("inf")
        rows.append(
            Row(
                "tiny model overhead phalanx / Lightning (CPU time)",
                share,
                0.1,
                "x",
                note=f"Lightning +{lit:.0f} us/step",
            )
        )
    return finish("trainer_overhead", rows, data, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
