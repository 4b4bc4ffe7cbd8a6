"""Per-rank memory of ModelParallelStrategy meshes vs raw DDP, 4 processes on CPU (gloo).

Run: python benchmarks/bench_model_parallel_memory.py [--blocks 4] [--features 256] [--hidden 2048] [--steps 3]

The same model (``--blocks`` residual MLP blocks ``features -> hidden -> features`` plus a
``features -> 1`` head) trains with AdamW for ``--steps`` steps in each variant, 4 real processes:

- ``ddp (raw torch)``: torch's DistributedDataParallel (``gradient_as_bucket_view=True``): the
  reference every mesh is compared with;
- ``model_parallel dp x tp``: ``Trainer(strategy=ModelParallelStrategy(...))`` for the meshes
  (4 x 1), (2 x 2) and (1 x 4): column/row-wise tensor parallel per block over ``tensor_parallel``
  and ``fully_shard`` per block over ``data_parallel``;
- ``model_parallel pp 2 x dp 2``: two pipeline stages (1F1B), each ``fully_shard``-ed over dp.

Per rank it prints the bytes of this rank's parameters, gradients and optimizer state after the
last step (exact, from the tensors; ``DTensor.to_local()`` for shards), the analytic expectation
beside it, and the peak resident-memory growth (``ru_maxrss`` at the end minus the RSS just
before the model is built; workers run with ``MALLOC_MMAP_THRESHOLD_=131072`` so freed transient
buffers are returned to the OS instead of being counted as live). The analytic per-rank state is
``P_tp / (tp * dp) + P_rest / dp`` parameters (FSDP pads each shard to equal size; ignored), the
same again for gradients, and twice that for AdamW's two moments (plus one step counter per tensor).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from typing import Any

MESHES = {"dp4": (4, 1, 1), "dp2_tp2": (2, 2, 1), "tp4": (1, 4, 1), "pp2_dp2": (2, 1, 2)}


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def _build(args: argparse.Namespace) -> Any:
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Linear(args.features, args.hidden)
            self.w2 = nn.Linear(args.hidden, args.features)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.w2(torch.tanh(self.w1(x)))

    torch.manual_seed(0)
    return nn.Sequential(*[MLP() for _ in range(args.blocks)], nn.Linear(args.features, 1))


def _state_bytes(params: list[Any], optimizer: Any) -> dict[str, int]:
    from torch.distributed.tensor import DTensor

    def local(t: Any) -> Any:
        return t.to_local() if isinstance(t, DTensor) else t

    p = sum(local(x).numel() * local(x).element_size() for x in params)
    g = sum(local(x.grad).numel() * local(x.grad).element_size() for x in params if x.grad is not None)
    o = sum(
        local(v).numel() * local(v).element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if hasattr(v, "numel")
    )
    return {"params": p, "grads": g, "optimizer": o}


def _expected(args: argparse.Namespace, dp: int, tp: int, pp: int) -> int:
    tp_params = args.blocks * (2 * args.features * args.hidden + args.hidden + args.features)
    rest = args.features + 1
    if pp > 1:
        return 4 * ((tp_params + rest) // pp) // dp * 4
    per_rank = tp_params // (tp * dp) + rest // dp
    return 4 * per_rank * 4  # params + grads + 2 Adam moments, 4 bytes each


def run_phalanx(args: argparse.Namespace, name: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from torch.utils.data import DataLoader, TensorDataset

    import phalanx
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    dp, tp, pp = MESHES[name]
    record: dict[str, Any] = {}

    class Net(phalanx.Module):
        def configure_model(self) -> None:
            record["rss_before"] = _rss_mb()
            self.net = _build(args)
            if pp > 1:
                return
            plan = {f"{i}.w1": ColwiseParallel() for i in range(args.blocks)}
            plan |= {f"{i}.w2": RowwiseParallel() for i in range(args.blocks)}
            parallelize_module(self.net, self.device_mesh["tensor_parallel"], plan)
            for block in list(self.net)[:-1]:
                fully_shard(block, mesh=self.device_mesh["data_parallel"])
            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def pipeline_stages(self) -> list[torch.nn.Module]:
            half = args.blocks // 2
            return [torch.nn.Sequential(*list(self.net)[:half]), torch.nn.Sequential(*list(self.net)[half:])]

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            if pp > 1:
                return self.trainer.strategy.run_pipeline(x, target=y, loss_fn=F.mse_loss)
            return F.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def on_train_end(self) -> None:
            params = list(self.parameters())
            record.update(_state_bytes(params, self.trainer.strategy.optimizers[0]), peak=_peak_mb())

    data = TensorDataset(torch.randn(64, args.features), torch.randn(64, 1))
    strategy = ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                     num_microbatches=2)
    trainer = phalanx.Trainer(accelerator="cpu", devices=4, strategy=strategy, max_steps=args.steps, logger=False,
                              enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Net(), DataLoader(data, batch_size=4))
    record["rank"] = trainer.global_rank
    with open(f"{args.out}.rank{trainer.global_rank}", "w") as handle:
        json.dump(record, handle)


def _ddp_worker(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    record: dict[str, Any] = {"rss_before": _rss_mb(), "rank": rank}
    net = _build(args)
    model = DistributedDataParallel(net, gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        x, y = torch.randn(4, args.features), torch.randn(4, 1)
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    record.update(_state_bytes(list(net.parameters()), optimizer), peak=_peak_mb())
    with open(f"{args.out}.rank{rank}", "w") as handle:
        json.dump(record, handle)
    dist.destroy_process_group()
    # torch 2.13's gloo can abort at interpreter shutdown in a process that made its own group (docs/ddp.md)
    os._exit(0)


def run_ddp(args: argparse.Namespace) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_ddp_worker, args=(args, port), nprocs=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant == "ddp":
        run_ddp(args)
        return
    if args.variant:
        run_phalanx(args, args.variant)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072", "PYTHONWARNINGS": "ignore"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ["ddp", *MESHES]:
            out = os.path.join(tmp, variant)
            command = [sys.executable, os.path.abspath(__file__), "--variant", variant, "--out", out,
                       "--blocks", str(args.blocks), "--features", str(args.features), "--hidden", str(args.hidden),
                       "--steps", str(args.steps)]
            subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            records = []
            for rank in range(4):
                with open(f"{out}.rank{rank}") as handle:
                    records.append(json.load(handle))
            dp, tp, pp = MESHES.get(variant, (4, 1, 1))
            expected = _expected(args, 1, 1, 1) if variant == "ddp" else _expected(args, dp, tp, pp)
            state = max(r["params"] + r["grads"] + r["optimizer"] for r in records)
            peak = max(r["peak"] - r["rss_before"] for r in records)
            rows.append((variant, f"{dp}x{tp}x{pp}" if variant != "ddp" else "ddp", state, expected, peak))
    base_state, base_peak = rows[0][2], rows[0][4]
    print(f"model: {args.blocks} blocks {args.features}->{args.hidden}->{args.features}, AdamW, 4 ranks, gloo CPU")
    print(f"{'variant':<10} {'dp x tp x pp':<13} {'state MB':>9} {'expected MB':>12} {'vs ddp':>7} {'peak growth MB':>15} {'vs ddp':>7}")
    for variant, mesh, state, expected, peak in rows:
        print(f"{variant:<10} {mesh:<13} {state / 1e6:>9.2f} {expected / 1e6:>12.2f} {state / base_state:>7.2f} "
              f"{peak:>15.1f} {peak / base_peak:>7.2f}")


if __name__ == "__main__":
    main()
