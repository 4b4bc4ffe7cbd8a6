"""ft_ddp (torchft) vs plain PyTorch DDP: step time without failures, time lost per failure.

Run:  python benchmarks/bench_torchft.py [--steps 120 --width 256 --step-sleep 0.05 --kill-at 40] [--quick]

Both jobs train the same MLP on the same data with 2 CPU processes (gloo, OMP_NUM_THREADS=1):
plain PyTorch is a hand-written DistributedDataParallel loop over 2 ranks; ft_ddp is
``Trainer(strategy=FTDDPStrategy(replica_groups=2))``, 2 replica groups of 1 rank with a local
lighthouse (started by phalanx). ``--step-sleep`` stands for the compute of a real step.

1. Step time without failures: median interval between training steps on rank 0 (steps after a
   warm-up), ft_ddp / plain DDP. ft_ddp pays a quorum round trip to the lighthouse and a
   should-commit round trip per step.
2. Time lost per failure: one rank (group) is killed with SIGKILL at step ``--kill-at``
   (``--ckpt-every`` > ``--kill-at`` by default: a failure before the first save, the common case
   of a long checkpoint interval; pass a smaller value to see the effect of a save).
   *Restart from checkpoint* (plain DDP with a checkpoint every ``--ckpt-every`` steps, the way a
   torchrun job with ``--max-restarts`` recovers): every rank is restarted, loads the last
   checkpoint and redoes the steps since. *ft_ddp*: the survivor stalls about ``--timeout``, goes on
   alone, and the restarted group heals from it. Time lost = time from the first to the last
   training step on rank 0 with the failure minus the same without one (the job's own start-up,
   noisy on a shared machine and paid once either way, is left out; the restart's is inside);
   for ft_ddp, each step group 0 trained alone adds half a step (half the data). Reported with
   the ratio ft_ddp / restart; the whole-job wall times are recorded too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _bench import Row, child_env, finish
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

_WARMUP = 5
_SAMPLES = 4096
_BATCH = 16


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(_SAMPLES, 32, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True).tanh())


def _layers(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(32, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1))


# ---------------------------------------------------------------- plain PyTorch DDP worker (one rank)
def _plain_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(_layers(args.width))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ckpt = Path(args.out) / "plain.ckpt"
    step = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    sampler: DistributedSampler[Any] = DistributedSampler(_data(), seed=0)
    loader = DataLoader(_data(), batch_size=_BATCH, sampler=sampler)
    stamps = (Path(args.out) / "stamps.txt").open("a") if rank == 0 else None
    while step < args.steps:
        for x, y in loader:
            if step >= args.steps:
                break
            if stamps is not None:
                stamps.write(f"{time.time()}\n")
                stamps.flush()
            if rank == 1 and step == args.kill_at and not (Path(args.out) / "killed").exists():
                (Path(args.out) / "killed").touch()
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(args.step_sleep)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            step += 1
            if rank == 0 and args.ckpt_every and step % args.ckpt_every == 0:
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
                os.replace(tmp, ckpt)
    if stamps is not None:
        stamps.close()
    dist.destroy_process_group()


def _run_plain(out: Path, args: argparse.Namespace, *, kill_at: int) -> float:
    """Wall time of a 2-rank plain DDP job; after a failure every rank restarts from the checkpoint."""
    started = time.perf_counter()
    for _attempt in range(3):
        port = _free_port()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    "plain",
                    "--out",
                    str(out),
                    "--steps",
                    str(args.steps),
                    "--width",
                    str(args.width),
                    "--step-sleep",
                    str(args.step_sleep),
                    "--kill-at",
                    str(kill_at),
                    "--ckpt-every",
                    str(args.ckpt_every),
                ],
                env=child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for rank in (0, 1)
        ]
        codes = [p.wait(600) for p in procs]
        if all(code == 0 for code in codes):
            return time.perf_counter() - started
    msg = "the plain DDP job did not finish in 3 attempts"
    raise SystemExit(msg)


# ---------------------------------------------------------------- ft_ddp job (phalanx starts the groups)
def _ft_job(args: argparse.Namespace) -> None:
    from phalanx_strategy_torchft import FTDDPStrategy

    import phalanx

    out = Path(args.out)

    class Bench(phalanx.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _layers(args.width)
            self.stamps: list[float] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.stamps.append(time.time())
            strategy = self.trainer.strategy
            step = self.trainer.global_step
            if strategy.replica_group_id == 1 and step == args.kill_at and not (out / "killed").exists():
                (out / "killed").touch()
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(args.step_sleep)
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    model = Bench()
    strategy = FTDDPStrategy(replica_groups=2, timeout=args.timeout, quorum_timeout=60)
    trainer = phalanx.Trainer(
        accelerator="cpu", devices=1, strategy=strategy, max_steps=args.steps, enable_progress_bar=False,
        logger=False, enable_checkpointing=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, DataLoader(_data(), batch_size=_BATCH, shuffle=True))
    if strategy.replica_group_id == 0:
        (out / "stamps.txt").write_text("".join(f"{t}\n" for t in model.stamps))
        (out / "commits.json").write_text(json.dumps(strategy.commit_log))


def _run_ft(out: Path, args: argparse.Namespace, *, kill_at: int) -> float:
    started = time.perf_counter()
    command = [sys.executable, __file__, "--worker", "ft", "--out", str(out), "--steps", str(args.steps),
               "--width", str(args.width), "--step-sleep", str(args.step_sleep), "--kill-at", str(kill_at),
               "--timeout", str(args.timeout)]  # fmt: skip
    result = subprocess.run(command, env=child_env(RUST_LOG="error"), capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-4000:])
        msg = f"the ft_ddp job exited with {result.returncode}"
        raise SystemExit(msg)
    return time.perf_counter() - started


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stamps(out: Path) -> list[float]:
    return [float(line) for line in (out / "stamps.txt").read_text().split()]


def _step_time(out: Path) -> float:
    stamps = _stamps(out)[_WARMUP:]
    return statistics.median(b - a for a, b in itertools.pairwise(stamps))


def _loop_time(out: Path) -> float:
    """First to last training step on rank 0 (group 0): the job's start-up, which is paid once and
    varies by seconds on a loaded machine, is left out; a restart after a failure is inside."""
    stamps = _stamps(out)
    return stamps[-1] - stamps[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--step-sleep", type=float, default=0.05, help="seconds of stand-in compute per step")
    parser.add_argument("--kill-at", type=int, default=40)
    parser.add_argument("--ckpt-every", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=5.0, help="ft_ddp's timeout for a dead group (s)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", choices=("plain", "ft"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "plain":
        _plain_worker(args)
        return 0
    if args.worker == "ft":
        _ft_job(args)
        return 0
    if args.quick:
        args.steps, args.kill_at, args.ckpt_every, args.timeout = 24, 10, 8, 3.0
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, run in (("plain", _run_plain), ("ft", _run_ft)):
            for failure in (False, True):
                out = Path(tmp) / f"{case}-{failure}"
                out.mkdir()
                times[f"{case}-{failure}-job"] = run(out, args, kill_at=args.kill_at if failure else -1)
                times[f"{case}-{failure}"] = _loop_time(out)
                if not failure:
                    times[f"{case}-step"] = _step_time(out)
                if case == "ft" and failure:
                    log = json.loads((out / "commits.json").read_text())
                    times["ft-alone-steps"] = sum(1 for e in log if e["committed"] and e["participants"] == 1)
                    times["ft-stall"] = max(e["seconds"] for e in log)
                print(
                    f"{case:5} failure={failure!s:5}: training loop {times[f'{case}-{failure}']:.2f}s, "
                    f"whole job {times[f'{case}-{failure}-job']:.2f}s",
                    flush=True,
                )
    step_ratio = times["ft-step"] / times["plain-step"]
    lost_restart = times["plain-True"] - times["plain-False"]
    # Steps group 0 trained alone used half the data of a full step: count half of each as lost.
    alone = times["ft-alone-steps"] * times["ft-step"] / 2
    lost_ft = times["ft-True"] - times["ft-False"] + alone
    rows = [
        Row("ft_ddp step time / plain DDP step time (no failure)", step_ratio, 1.5, "x",
            note=f"{times['ft-step'] * 1e3:.1f} ms vs {times['plain-step'] * 1e3:.1f} ms, step_sleep {args.step_sleep * 1e3:.0f} ms"),
        Row("time lost per failure: ft_ddp / restart from checkpoint", lost_ft / max(lost_restart, 1e-9), 1.0, "x",
            note=f"{lost_ft:.1f} s (stall {times['ft-stall']:.1f} s, {times['ft-alone-steps']:.0f} steps alone) vs "
            f"{lost_restart:.1f} s; kill at step {args.kill_at}, checkpoint every {args.ckpt_every}"),
    ]  # fmt: skip
    data = {"seconds": times, "args": {k: v for k, v in vars(args).items() if k not in ("worker", "out")}}
    status = finish("torchft", rows, data, quick=args.quick)
    if not args.quick:
        _plot(times)
    return status


def _plot(times: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    labels = ["restart from checkpoint\n(plain DDP)", "ft_ddp\n(torchft)"]
    alone = times["ft-alone-steps"] * times["ft-step"] / 2
    lost = [times["plain-True"] - times["plain-False"], times["ft-True"] - times["ft-False"] + alone]
    ax.bar(labels, lost, color=["#b55", "#5a5"])
    ax.set_ylabel("wall time lost to one failure (s)")
    ax.set_ylim(0, max(lost) * 1.2)
    for i, value in enumerate(lost):
        ax.text(i, value, f"{value:.1f} s", ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(Path(__file__).resolve().parent.parent / "docs" / "img" / "bench_torchft.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
