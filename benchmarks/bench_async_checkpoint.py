"""How long a sharded FSDP save stops the training loop: synchronous vs asynchronous, 2 ranks on CPU.

Run: python benchmarks/bench_async_checkpoint.py [--blocks 48] [--width 1024] [--saves 3] [--every 8]

The model is the FSDP benchmark's (``bench_fsdp_memory.py``: ``--blocks`` linear layers of
``width x width``, 50.4M parameters by default, AdamW, so a checkpoint holds about 600 MB of
weights and optimizer state, half per rank). Each variant trains on 2 gloo ranks and saves a
sharded checkpoint ``--saves`` times, ``--every`` steps apart; the time the loop is stopped by
each save is measured on rank 0 around the call:

- ``raw torch``: FSDP2 ``fully_shard`` per layer, ``torch.distributed.checkpoint.save`` vs
  ``async_save`` (waiting for the previous one before the next, as one must);
- ``phalanx``: ``Trainer(strategy=FSDPStrategy(...))`` and ``trainer.save_checkpoint(path)``,
  without and with ``plugins=[AsyncCheckpointIO()]`` (staging, ``meta.pt``, atomic publish).

An asynchronous save still stops the loop while the shards are copied to CPU memory; the write,
the fsync and the publish run in the background during the next steps. If those steps take less
time than the write, the next save waits for it, and that wait is counted as blocking too. The
headline is phalanx's async / sync median blocking time (target: at most 0.2).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from _bench import Row, finish, spread

VARIANTS = ("raw", "phalanx")
TARGET = 0.2


def _layers(blocks: int, width: int) -> Any:
    from torch import nn

    return nn.Sequential(*[nn.Linear(width, width) for _ in range(blocks)])


def _step(model: Any, optimizer: Any, width: int) -> None:
    import torch

    model(torch.randn(2, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _raw_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    record: dict[str, Any] = {"rank": dist.get_rank()}
    for mode in ("sync", "async"):
        model = _layers(args.blocks, args.width)
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        group = dist.new_group(backend="gloo") if mode == "async" else None
        pending: Any = None
        blocked = []
        for index in range(args.saves):
            for _ in range(args.every):
                _step(model, optimizer, args.width)
            started = time.perf_counter()
            if pending is not None:
                pending.result()
            state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
            path = os.path.join(args.out, f"raw_{mode}_{index}")
            if mode == "sync":
                dcp.save(state, checkpoint_id=path)
            else:
                pending = dcp.async_save(state, checkpoint_id=path, process_group=group)
            blocked.append(time.perf_counter() - started)
        if pending is not None:
            pending.result()
        record[mode] = blocked
    dist.destroy_process_group()
    return record


def _phalanx_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import phalanx
    from phalanx.callbacks import Callback
    from phalanx.checkpoint_io import AsyncCheckpointIO
    from phalanx_strategy_fsdp import FSDPStrategy

    record: dict[str, Any] = {}

    class Layers(phalanx.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers: nn.Module | None = None

        def configure_model(self) -> None:
            self.layers = _layers(args.blocks, args.width)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layers(batch[0]).square().mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> DataLoader:
            samples = 2 * 2 * args.every * args.saves  # batches of 2 on each of the 2 ranks
            return DataLoader(TensorDataset(torch.randn(samples, args.width)), batch_size=2)

    class TimedSaves(Callback):
        def __init__(self, mode: str) -> None:
            self.mode, self.blocked = mode, []

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if (batch_idx + 1) % args.every:
                return
            started = time.perf_counter()
            trainer.save_checkpoint(os.path.join(args.out, f"phalanx_{self.mode}_{batch_idx}.ckpt"))
            self.blocked.append(time.perf_counter() - started)

    for mode in ("sync", "async"):
        timed = TimedSaves(mode)
        trainer = phalanx.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}),
            plugins=[AsyncCheckpointIO()] if mode == "async" else None,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[timed],
            default_root_dir=args.out,
        )
        trainer.fit(Layers())
        record[mode] = timed.blocked
        record["rank"] = trainer.global_rank
    return record


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    base = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--out", args.out]
    base += ["--blocks", str(args.blocks), "--width", str(args.width), "--saves", str(args.saves)]
    base += ["--every", str(args.every)]
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    if variant == "phalanx":  # phalanx starts rank 1 itself, by re-running this command
        procs = [subprocess.Popen(base, env=env)]
    else:
        port = str(_free_port())
        procs = [
            subprocess.Popen(
                base, env={**env, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            )
            for r in range(2)
        ]
    for proc in procs:
        if proc.wait(timeout=900) != 0:
            msg = f"{variant} worker exited with {proc.returncode}"
            raise RuntimeError(msg)
    with open(os.path.join(args.out, f"{variant}_rank0.json")) as handle:
        return dict(json.load(handle))


def main() -> int:
    """Launch both variants, print the blocking times and the target row; 1 when it is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=48)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--every", type=int, default=8, help="training steps between two saves")
    parser.add_argument(
        "--quick", action="store_true", help="a 2-layer model: proves the script runs, measures nothing"
    )
    parser.add_argument("--worker", choices=VARIANTS)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        record = _phalanx_worker(args) if args.worker == "phalanx" else _raw_worker(args)
        with open(os.path.join(args.out, f"{args.worker}_rank{record['rank']}.json"), "w") as handle:
            json.dump(record, handle)
        if args.worker == "phalanx":
            return 0  # rank 0 must wait for the rank it launched; phalanx's own group exits cleanly
        # torch 2.13's gloo can abort at interpreter shutdown in a process that made its own group (docs/ddp.md)
        sys.stdout.flush()
        os._exit(0)
    if args.quick:
        args.blocks, args.width, args.saves, args.every = 2, 64, 2, 1
    params = args.blocks * (args.width * args.width + args.width)
    with tempfile.TemporaryDirectory() as out:
        args.out = out
        results = {variant: _launch(variant, args) for variant in VARIANTS}
    print(f"model: {params / 1e6:.1f}M parameters ({args.blocks} x Linear({args.width}, {args.width})), AdamW, 2 ranks")
    print(
        f"{args.saves} sharded saves, {args.every} training steps apart; seconds the loop was stopped per save (rank 0)"
    )
    print(f"{'variant':<12} {'sync':>32} {'async':>32} {'async/sync':>11}")
    medians: dict[str, dict[str, float]] = {}
    for variant, record in results.items():
        sync, asynchronous = spread(record["sync"]), spread(record["async"])
        medians[variant] = {"sync": sync.median, "async": asynchronous.median}
        print(f"{variant:<12} {sync!s:>32} {asynchronous!s:>32} {asynchronous.median / sync.median:>11.3f}")
    ratio = medians["phalanx"]["async"] / medians["phalanx"]["sync"]
    rows = [
        Row(
            f"phalanx fsdp async / sync save blocking, {params / 1e6:.1f}M params",
            ratio,
            TARGET,
            "x",
            note=f"raw torch: {medians['raw']['async'] / medians['raw']['sync']:.3f}",
        )
    ]
    data = {"params": params, "saves": args.saves, "every": args.every, "blocked_s": results, "medians_s": medians}
    return finish("async_checkpoint", rows, data, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
