"""Per-rank memory of FSDP vs DDP for parameters + gradients + optimizer state, 2 ranks on CPU.

Run: python benchmarks/bench_fsdp_memory.py [--blocks 48] [--width 1024] [--steps 3]

Three variants train the same model (``--blocks`` linear layers of ``width x width``: 50.4M
parameters by default) with AdamW for ``--steps`` steps on gloo, each as 2 real processes:

- ``ddp (raw torch)``: torch's DistributedDataParallel, ``gradient_as_bucket_view=True`` (so DDP
  keeps no second copy of the gradients: the leanest DDP there is);
- ``fsdp2 (raw torch)``: ``fully_shard`` per layer, the model built on the meta device;
- ``phalanx fsdp``: ``Trainer(strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}))`` with the model
  built in ``configure_model`` (sharded initialisation).

What is measured, per rank. The batch is 2 rows, so activations are negligible (< 1 MB) and the
memory a run adds is its parameters, gradients, optimizer state and the buffers needed to use
them (DDP's all-reduce, FSDP's all-gathered layer and its gradient before reduce-scatter):

1. *peak growth*: ``ru_maxrss`` (the process's peak resident memory, as the OS counts it) at the
   end of training minus the resident memory just before the model is built. Each process first
   runs its stack once on a tiny model, so one-time costs (lazy imports, dispatch tables, gloo
   buffers: about 30 MB on first ``fully_shard``) are not charged to the model. The workers run
   with ``MALLOC_MMAP_THRESHOLD_=131072``: by default glibc raises its mmap threshold after the
   first large free, and from then on keeps freed buffers of a few MB in its heap instead of
   returning them, so RSS would count FSDP's per-layer transient buffers (freed after each layer)
   as if they were all alive at once (measured: 1.1 GB instead of 0.42 GB for raw FSDP2). Pass
   ``--no-malloc-fix`` to see that effect; it applies to the DDP run too.
2. *state at rest*: bytes of this rank's parameter, gradient and optimizer-state tensors after the
   last step (``DTensor.to_local()`` for shards), counted exactly from the tensors.

The headline ratio is phalanx fsdp's peak growth over ddp's (target: at most 0.55). FSDP cannot
reach exactly 0.5: one layer's full parameters and gradients (plus the prefetched next layer) exist
transiently during forward/backward, so more, smaller sharding units bring it closer to 0.5.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from typing import Any

from _bench import Row, finish

VARIANTS = ("ddp", "fsdp_raw", "phalanx")
LABELS = {"ddp": "ddp (raw torch)", "fsdp_raw": "fsdp2 (raw torch)", "phalanx": "phalanx fsdp"}
TARGET = 0.55


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _state_bytes(model: Any, optimizer: Any) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state (local shards only).

    Gradients are counted as the parameters' size whether or not they are allocated right now
    (the Trainer frees them at the next step's start, raw loops right after the step).
    """
    import torch
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    total = 0
    for param in model.parameters():  # x2: the parameter and its gradient (as after backward)
        total += 2 * local(param).numel() * param.element_size()
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                total += local(value).numel() * value.element_size()
    return total


def _layers(blocks: int, width: int) -> Any:
    from torch import nn

    return nn.Sequential(*[nn.Linear(width, width) for _ in range(blocks)])


def _train(model: Any, optimizer: Any, steps: int, width: int) -> None:
    import torch

    for _ in range(steps):
        model(torch.randn(2, width)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _raw_worker(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if variant == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        def wrap(model: Any) -> Any:
            return DistributedDataParallel(model, gradient_as_bucket_view=True)

        def build() -> Any:
            return wrap(_layers(args.blocks, args.width))
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))

        def build() -> Any:
            with torch.device("meta"):
                model = _layers(args.blocks, args.width)
            for layer in model:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            model.to_empty(device="cpu")
            with torch.no_grad():
                for layer in model:
                    layer.reset_parameters()
            return model

        def wrap(model: Any) -> Any:
            for layer in model:
                fully_shard(layer, mesh=mesh)
            return fully_shard(model, mesh=mesh)

    warm = wrap(_layers(2, 8))  # one-time costs of the stack, on a tiny model
    _train(warm, torch.optim.AdamW(warm.parameters()), 1, 8)
    before = _rss()
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    _train(model, optimizer, args.steps, args.width)
    record = {"growth": _peak() - before, "at_rest": _state_bytes(model, optimizer), "rank": dist.get_rank()}
    dist.destroy_process_group()
    return record


def _phalanx_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.utils.data import DataLoader, TensorDataset

    import phalanx
    from phalanx_strategy_fsdp import FSDPStrategy

    record: dict[str, Any] = {}

    class Layers(phalanx.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers: nn.Module | None = None

        def configure_model(self) -> None:
            with torch.device("cpu"):  # configure_model runs on the meta device; the warm-up must be real
                warm = nn.Sequential(nn.Linear(8, 8))  # one-time costs of the stack, on a tiny model
                fully_shard(warm, mesh=self.trainer.strategy.device_mesh)
                _train(warm, torch.optim.AdamW(warm.parameters()), 1, 8)
            record["before"] = _rss()
            self.layers = _layers(args.blocks, args.width)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layers(batch[0]).square().mean()

        def on_train_end(self) -> None:
            record["growth"] = _peak() - record.pop("before")
            record["at_rest"] = _state_bytes(self, self.trainer.strategy.optimizers[0])
            record["rank"] = self.global_rank

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(torch.randn(4 * args.steps, args.width)), batch_size=2)

    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}),
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=args.out,
    )
    trainer.fit(Layers())
    return record


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(variant: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    base = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--out", args.out]
    base += ["--blocks", str(args.blocks), "--width", str(args.width), "--steps", str(args.steps)]
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    if args.malloc_fix:
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
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
        if proc.wait(timeout=600) != 0:
            msg = f"{variant} worker exited with {proc.returncode}"
            raise RuntimeError(msg)
    return [json.load(open(os.path.join(args.out, f"{variant}_rank{r}.json"))) for r in range(2)]


def main() -> int:
    """Launch every variant, print the table and the target row; 1 when it is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=48)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--no-malloc-fix",
        dest="malloc_fix",
        action="store_false",
        help="keep glibc's dynamic mmap threshold (RSS then also counts freed buffers glibc keeps)",
    )
    parser.add_argument("--quick", action="store_true", help="a 2-layer model: proves the script runs, measures nothing")
    parser.add_argument("--worker", choices=VARIANTS)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        record = _phalanx_worker(args) if args.worker == "phalanx" else _raw_worker(args.worker, args)
        with open(os.path.join(args.out, f"{args.worker}_rank{record['rank']}.json"), "w") as handle:
            json.dump(record, handle)
        if args.worker == "phalanx":
            # A normal exit: rank 0 must wait for the rank it launched (whose parent-death signal
            # would kill it mid-write), and phalanx's own group does not hit the abort below.
            return 0
        # torch 2.13's gloo can abort at interpreter shutdown in a process that made its own group (docs/ddp.md)
        sys.stdout.flush()
        os._exit(0)
    if args.quick:
        args.blocks, args.width, args.steps = 2, 64, 1
    params = args.blocks * (args.width * args.width + args.width)
    with tempfile.TemporaryDirectory() as out:
        args.out = out
        results = {variant: _launch(variant, args) for variant in VARIANTS}
    ddp_growth = max(r["growth"] for r in results["ddp"])
    ddp_rest = max(r["at_rest"] for r in results["ddp"])
    print(
        f"model: {params / 1e6:.1f}M parameters ({args.blocks} x Linear({args.width}, {args.width})), AdamW, 2 ranks, gloo"
    )
    print(f"{'variant':<20} {'peak growth MB':>15} {'vs ddp':>7} {'state at rest MB':>17} {'vs ddp':>7}")
    for variant, records in results.items():
        growth = max(r["growth"] for r in records)  # the worse of the two ranks
        rest = max(r["at_rest"] for r in records)
        print(
            f"{LABELS[variant]:<20} {growth / 1e6:>15.1f} {growth / ddp_growth:>7.3f} {rest / 1e6:>17.1f} {rest / ddp_rest:>7.3f}"
        )
    ratio = max(r["growth"] for r in results["phalanx"]) / ddp_growth
    rows = [Row(f"fsdp / ddp peak per-rank memory, {params / 1e6:.1f}M params, 2 ranks", ratio, TARGET, "x")]
    data = {
        "params": params,
        "ranks": 2,
        "bytes_per_param_expected": {"ddp": 16.0, "fsdp_raw": 8.0, "phalanx": 8.0},
        "peak_growth_bytes": {v: max(r["growth"] for r in records) for v, records in results.items()},
        "at_rest_bytes": {v: max(r["at_rest"] for r in records) for v, records in results.items()},
    }
    return finish("fsdp_memory", rows, data, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
