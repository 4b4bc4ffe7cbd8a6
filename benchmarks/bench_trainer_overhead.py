"""Step time of phalanx's Trainer against a plain PyTorch loop, same model and data, one process.

    python benchmarks/bench_trainer_overhead.py              # defaults: MLP, 200 steps x 5 rounds
    python benchmarks/bench_trainer_overhead.py --log        # also self.log the loss every step

Both loops train a fresh copy of the same model on the same DataLoader. Rounds alternate (plain,
phalanx, plain, ...) so a noisy neighbour affects both equally; the per-step time of each loop is
the median over rounds, and setup (optimizer creation, strategy setup) is excluded from both. Wall
time and this process's CPU time are both reported: on a shared machine the CPU-time ratio is the
trustworthy one (wall time also counts the moments the OS gave the core to someone else). The
target is a ratio <= 1.02.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.callbacks import Callback


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per loop (after one warm-up)")
    parser.add_argument("--width", type=int, default=512, help="hidden width of the MLP")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps the timing stable)")
    parser.add_argument("--log", action="store_true", help="call self.log('loss', ...) in every step")
    return parser.parse_args()


def make_model(width: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(256, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 1),
    )


class Wrapped(Module):
    """The same network as a phalanx Module."""

    def __init__(self, net: nn.Module, log: bool) -> None:
        super().__init__()
        self.net = net
        self.log_loss = log

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if self.log_loss:
            self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _per_step(start: tuple[float, float], steps: int) -> tuple[float, float]:
    wall, cpu = _now()
    return (wall - start[0]) / steps, (cpu - start[1]) / steps


class Stopwatch(Callback):
    """Times the training loop only (from the first batch to the end of the last)."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.start = _now()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.result = _per_step(self.start, trainer.global_step)


def plain_round(net: nn.Module, data: DataLoader, steps: int) -> tuple[float, float]:
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net.train()
    start = _now()
    done = 0
    while done < steps:
        for x, y in data:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    return _per_step(start, steps)


def phalanx_round(net: nn.Module, data: DataLoader, steps: int, log: bool) -> tuple[float, float]:
    watch = Stopwatch()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=[watch],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(Wrapped(net, log), data)
    return watch.result


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(4096, 256), torch.randn(4096, 1)), batch_size=args.batch_size)
    base = make_model(args.width)
    plain_round(copy.deepcopy(base), data, 20)  # warm-up: allocator, kernels, lazy imports
    phalanx_round(copy.deepcopy(base), data, 20, args.log)
    plain, ours = [], []
    for _ in range(args.rounds):
        gc.collect()  # garbage of the previous round must not be collected inside the next timing
        plain.append(plain_round(copy.deepcopy(base), data, args.steps))
        gc.collect()
        ours.append(phalanx_round(copy.deepcopy(base), data, args.steps, args.log))
    print(
        f"model: MLP width {args.width}, batch {args.batch_size}, {args.steps} steps x {args.rounds} rounds, {args.threads} thread(s)"
    )
    print(f"{'loop':<16}{'wall ms/step':>14}{'cpu ms/step':>14}{'cpu best':>12}")
    stats = {}
    for name, values in (("plain PyTorch", plain), ("phalanx Trainer", ours)):
        wall = statistics.median(v[0] for v in values) * 1e3
        cpu = statistics.median(v[1] for v in values) * 1e3
        best = min(v[1] for v in values) * 1e3
        stats[name] = (wall, cpu, best)
        print(f"{name:<16}{wall:>14.3f}{cpu:>14.3f}{best:>12.3f}")
    ratios = [stats["phalanx Trainer"][i] / stats["plain PyTorch"][i] for i in range(3)]
    print(
        f"step-time ratio phalanx / plain: wall {ratios[0]:.4f}, cpu {ratios[1]:.4f}, cpu best {ratios[2]:.4f}"
        "  (target <= 1.02; medians over rounds, 'best' = fastest round)"
    )


if __name__ == "__main__":
    main()
