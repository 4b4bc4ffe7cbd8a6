"""Step time of phalanx's Trainer against a plain PyTorch loop, same model and data, one process.

    python benchmarks/bench_trainer_overhead.py              # defaults: MLP, 200 steps x 5 rounds
    python benchmarks/bench_trainer_overhead.py --log        # also self.log the loss every step

Both loops train a fresh copy of the same model on the same DataLoader. Rounds alternate (plain,
phalanx, plain, ...) so a noisy neighbour affects both equally; the per-step time of each loop is
the median over rounds, and setup (optimizer creation, strategy setup) is excluded from both. The
target is a ratio <= 1.02.
"""

from __future__ import annotations

import argparse
import copy
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
        nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
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


class Stopwatch(Callback):
    """Times the training loop only (from the first batch to the end of the last)."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.start = time.perf_counter()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.seconds = time.perf_counter() - self.start


def plain_round(net: nn.Module, data: DataLoader, steps: int) -> float:
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net.train()
    start = time.perf_counter()
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
    return (time.perf_counter() - start) / steps


def phalanx_round(net: nn.Module, data: DataLoader, steps: int, log: bool) -> float:
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
    return watch.seconds / steps


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
        plain.append(plain_round(copy.deepcopy(base), data, args.steps))
        ours.append(phalanx_round(copy.deepcopy(base), data, args.steps, args.log))
    plain_ms, ours_ms = statistics.median(plain) * 1e3, statistics.median(ours) * 1e3
    ratio = ours_ms / plain_ms
    print(f"model: MLP width {args.width}, batch {args.batch_size}, {args.steps} steps x {args.rounds} rounds, {args.threads} thread(s)")
    print(f"{'loop':<16}{'median ms/step':>16}{'min':>10}{'max':>10}")
    for name, values in (("plain PyTorch", plain), ("phalanx Trainer", ours)):
        ms = [v * 1e3 for v in values]
        print(f"{name:<16}{statistics.median(ms):>16.3f}{min(ms):>10.3f}{max(ms):>10.3f}")
    print(f"overhead ratio (phalanx / plain): {ratio:.4f}  (target <= 1.02)")


if __name__ == "__main__":
    main()
