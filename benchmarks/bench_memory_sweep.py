"""Per-rank memory of every strategy as the model grows (1M -> 200M parameters), measured and planned.

Run: python benchmarks/bench_memory_sweep.py [--ranks 2,4] [--strategies ddp,fsdp,...] [--quick]

For each rank count (2 and 4 CPU ranks on gloo) and each strategy (ddp, fsdp, deepspeed_stage_2,
deepspeed_stage_3, model_parallel), one real launch through ``phalanx.Trainer`` (which starts the
other ranks itself by re-running this script) trains stacks of ``Linear(width, width)`` + ReLU of
growing size, smallest first, one after another in the same ranks: two AdamW steps each (float32,
4 rows per batch), measured in the second (AdamW creates its state in the first step, after
backward, so only the second holds gradients and optimizer state at once). A tiny model runs
first, unrecorded, so one-time costs (gloo buffers, lazy imports) are not charged to a size.
Every launch runs under a timeout in a session of its own (``phalanx.testing``'s ``Job``);
whatever it leaves running is killed and reported.

Measured per rank (the table shows the worse rank):

- *live tensors* (the markers of the plots): the bytes of every live tensor storage, each counted
  once (``phalanx.testing.memory_probe.live_storages``, the probe the estimate tests use), minus
  those alive before the model was built, sampled after forward, after backward and after the
  step; the largest sample. Buffers that live only between those points (FSDP's gathered unit and
  its unsharded gradients, DeepSpeed's reduce buckets inside backward) are not seen.
- *peak RSS growth*: ``ru_maxrss`` after the run minus the resident memory just before the model
  was built (sizes grow 5-10x, so the process's peak is this size's). It sees those transient
  buffers and what no Python object holds (gloo, DeepSpeed's C++ side), and also the copies made
  while wrapping the model. The workers run with ``MALLOC_MMAP_THRESHOLD_=131072`` so freed
  buffers go back to the OS instead of staying resident.

Beside each, the planner's estimate (``phalanx.planning.estimate_memory`` through the installed
plugins, the model built on the meta device, the same strategy parameters as the run): the
``total`` that ``phalanx plan`` prints (weights, gradients, optimizer state, traced activations
and ``other``: buckets and gathered units).

Strategy settings, the same for the run and the estimate: ddp with ``gradient_as_bucket_view``
(the reducer's buckets are then the gradients, so no C++-only copy escapes the count); fsdp with
each ``Linear`` its own unit; DeepSpeed's buckets sized to one layer (``width**2`` elements; the
defaults, 2e8 elements, are 800 MB per bucket per rank whatever the model); model_parallel as
dp = ranks / 2 x tp = 2, consecutive Linears column- then row-wise.

Left out, and said so in the output: sizes the estimate says the ranks together could not hold in
``--ram-gib``, and at 4 ranks ddp and ZeRO-2 (whole weights on every rank) above 50M (time).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import Row, finish
from _sweep_model import BATCH, estimate, overrides, params_of, stack

STRATEGIES = ("ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3", "model_parallel")
#: (layers, width): 1.05M, 10.5M, 50.4M, 201M parameters.
SIZES = ((4, 512), (10, 1024), (12, 2048), (12, 4096))
QUICK_SIZES = ((2, 128),)
#: Run first in every launch and not recorded: one-time costs (gloo buffers, lazy imports) are
#: then not charged to the first measured size.
WARM_UP = (2, 64)
MiB = 2**20
#: Resident memory of one rank before its model exists (torch, deepspeed, gloo), for the RAM check.
PROCESS_BYTES = 700 * MiB
TIMEOUT = 300.0
#: Largest model per (ranks, strategy) in the full sweep: at 4 ranks the strategies that keep whole
#: weights on every rank stop at 50M (ddp at 200M: 4 x 3.8 GiB on a shared 24 GiB machine, and
#: the time: the full sweep must stay under 12 minutes on 2 cores).
TOP_PARAMS = {(4, "ddp"): 60_000_000, (4, "deepspeed_stage_2"): 60_000_000}


# ----------------------------------------------------------------------------------------- ranks


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _local(tensor: Any) -> Any:
    return tensor.to_local() if type(tensor).__name__ == "DTensor" else tensor


def _worker(args: argparse.Namespace) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import phalanx
    from phalanx.callbacks import Callback
    from phalanx.registry import StrategyRegistry
    from phalanx.testing.memory_probe import live_storages

    torch.set_num_threads(1)
    ranks = int(args.ranks)

    class Stack(phalanx.Module):
        def __init__(self, layers: int, width: int, *, mesh: bool) -> None:
            super().__init__()
            self.shape, self.mesh = (layers, width), mesh
            self.net: torch.nn.Module | None = None

        def configure_model(self) -> None:  # sharded strategies build it sharded (meta / zero.Init)
            if self.net is not None:
                return
            self.net = stack(*self.shape)
            if self.mesh:
                from torch.distributed.fsdp import fully_shard
                from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

                linears = [i for i, m in enumerate(self.net) if isinstance(m, torch.nn.Linear)]
                plan = {str(i): ColwiseParallel() if k % 2 == 0 else RowwiseParallel() for k, i in enumerate(linears)}
                parallelize_module(self.net, self.device_mesh["tensor_parallel"], plan)
                for i in linears:
                    fully_shard(self.net[i], mesh=self.device_mesh["data_parallel"])
                fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            assert self.net is not None
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Probe(Callback):
        """Samples live tensor bytes and RSS at the second step's hooks; keeps the largest.

        The first step is skipped: AdamW creates its state in it, after backward, so only the
        second step holds gradients and optimizer state at once (ZeRO-2's gradient partitions
        exist only from backward to the step).
        """

        def __init__(self) -> None:
            gc.collect()
            self.baseline, self.rss0 = set(live_storages()), _rss()
            self.record: dict[str, Any] = {"live": 0, "rss_growth": 0, "at": "", "split": {}}

        def sample(self, module: torch.nn.Module, where: str) -> None:
            live = {p: n for p, n in live_storages().items() if p not in self.baseline}
            self.record["rss_growth"] = max(self.record["rss_growth"], _rss() - self.rss0)
            if sum(live.values()) <= self.record["live"]:
                return
            ps = list(module.parameters())
            params = {_local(getattr(p, "ds_tensor", p)).untyped_storage().data_ptr() for p in ps}
            grads = {_local(p.grad).untyped_storage().data_ptr() for p in ps if p.grad is not None} - params
            state: set[int] = set()
            for opt in (o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)):
                for group in opt.param_groups:  # a library's float32 masters and their gradients
                    state |= {_local(p).untyped_storage().data_ptr() for p in group["params"]}
                    grads |= {
                        _local(p.grad).untyped_storage().data_ptr() for p in group["params"] if p.grad is not None
                    }
                for values in opt.state.values():
                    state |= {_local(t).untyped_storage().data_ptr() for t in values.values() if torch.is_tensor(t)}
            parts = {"parameters": params, "gradients": grads - state, "optimizer_states": state - params - grads}
            split = {k: sum(n for p, n in live.items() if p in ptrs) for k, ptrs in parts.items()}
            self.record.update(live=sum(live.values()), at=where, split=split)

        def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
            if trainer.global_step == 1:
                self.sample(pl_module, "forward")

        def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
            if trainer.global_step == 1:
                self.sample(pl_module, "backward")

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *rest: Any) -> None:
            if trainer.global_step == 2:
                self.sample(pl_module, "step")

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            # ru_maxrss is the process's peak so far: sizes run smallest first, so it is this size's.
            self.record["peak_rss_growth"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.rss0

    warm = [] if args.quick else [WARM_UP]
    for name in args.worker.split(","):
        for layers, width in warm + json.loads(args.sizes):
            data = DataLoader(TensorDataset(torch.randn(2 * BATCH, width)), batch_size=BATCH)
            probe, model = Probe(), Stack(layers, width, mesh=name == "model_parallel")
            strategy = StrategyRegistry.get(name, **overrides(name, width, ranks))
            start = time.perf_counter()
            trainer = phalanx.Trainer(
                accelerator="cpu",
                devices=ranks,
                strategy=strategy,
                max_steps=2,
                callbacks=[probe],
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                use_distributed_sampler=False,
                default_root_dir=args.out,
            )
            trainer.fit(model, data)
            probe.record["seconds"] = time.perf_counter() - start
            file = f"{name}-{params_of(layers, width)}-rank{trainer.global_rank}.json"
            Path(args.out, file).write_text(json.dumps(probe.record))
            del trainer, model, strategy, probe, data
            gc.collect()


# ---------------------------------------------------------------------------------------- driver


def _launch(names: list[str], ranks: int, sizes: list[list[int]], out: Path, args: argparse.Namespace) -> str | None:
    """One launch of ``names`` (one after the other) on ``ranks`` over ``sizes``; the error, or None."""
    from phalanx.testing.processes import Job, describe_processes

    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        ",".join(names),
        "--ranks",
        str(ranks),
        "--sizes",
        json.dumps(sizes),
        "--out",
        str(out),
        *(["--quick"] if args.quick else []),
    ]
    env = {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "DS_ACCELERATOR": "cpu",
        "MASTER_ADDR": "127.0.0.1",
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "PYTHONWARNINGS": "ignore",
    }
    job = Job(command, out, env=env, name="launch")
    try:
        code = job.wait(args.timeout)
    except TimeoutError:  # Job.wait has killed everything the launch started
        return f"timed out after {args.timeout:.0f} s"
    left = job.leftovers()
    if left:
        job.kill_leftovers()
        print(f"  killed what the launch left running:\n{describe_processes(left)}")
    return f"exit {code}: {job.stderr[-3000:]}" if code != 0 else None


def main() -> int:
    """Run the sweep, print the table, record it; 1 when a target is missed, 2 when a launch failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4", help="comma-separated rank counts")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--ram-gib", type=float, default=16.0, help="leave out sizes whose ranks would need more")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per launch")
    parser.add_argument("--quick", action="store_true", help="one tiny model on 2 ranks, one launch: proves it runs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return 0
    rank_counts = [2] if args.quick else [int(r) for r in args.ranks.split(",")]
    strategies = args.strategies.split(",")
    sizes = QUICK_SIZES if args.quick else SIZES
    # One launch per (ranks, strategy), so a failure loses one strategy; quick: one launch for all.
    groups = (
        [(r, strategies) for r in rank_counts] if args.quick else [(r, [n]) for r in rank_counts for n in strategies]
    )
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    left_out: list[str] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks, names in groups:
            plans = {(n, s): estimate(n, *s, ranks) for n in names for s in sizes}
            need = {s: ranks * (max(plans[n, s]["total"] for n in names) + PROCESS_BYTES) for s in sizes}
            top = float("inf") if args.quick else min(TOP_PARAMS.get((ranks, n), float("inf")) for n in names)
            fits = [s for s in sizes if need[s] <= args.ram_gib * 2**30 and params_of(*s) <= top]
            left_out += [
                f"{'/'.join(names)} x{ranks} at {params_of(*s) / 1e6:.0f}M ("
                + (
                    f"over {top / 1e6:.0f}M: time budget"
                    if params_of(*s) > top
                    else f"needs ~{need[s] / 2**30:.1f} GiB of {args.ram_gib:g}"
                )
                + ")"
                for s in sizes
                if s not in fits
            ]
            out = Path(tmp, f"{ranks}-{names[0]}")
            out.mkdir()
            begun = time.perf_counter()
            error = _launch(names, ranks, [list(s) for s in fits], out, args) if fits else None
            print(
                f"{'+'.join(names)} x{ranks}: {len(fits)} sizes in {time.perf_counter() - begun:.0f} s"
                + (f"  FAILED {error}" if error else ""),
                flush=True,
            )
            if error:
                failed.append(f"{'+'.join(names)} x{ranks}")
            for name in names:
                for s in fits:
                    n = params_of(*s)
                    records = [json.loads(p.read_text()) for p in sorted(out.glob(f"{name}-{n}-rank*.json"))]
                    if len(records) != ranks:
                        continue
                    worst = max(records, key=lambda r: r["live"])
                    results.append(
                        {
                            "strategy": name,
                            "ranks": ranks,
                            "layers": s[0],
                            "width": s[1],
                            "params": n,
                            "measured_live": worst["live"],
                            "measured_split": worst["split"],
                            "peak_at": worst["at"],
                            "rss_growth": max(r["rss_growth"] for r in records),
                            "estimate": plans[name, s],
                            "peak_rss_growth": max(r["peak_rss_growth"] for r in records),
                            "seconds": max(r["seconds"] for r in records),
                        }
                    )
    elapsed = time.perf_counter() - started
    _print_table(results, rank_counts, strategies)
    if left_out:
        print("left out: " + "; ".join(left_out))
    print(f"sweep took {elapsed:.0f} s")
    rows = _targets(results)
    data = {
        "sizes": [list(s) for s in sizes],
        "ranks": rank_counts,
        "strategies": strategies,
        "results": results,
        "left_out": left_out,
        "failed": failed,
        "seconds": elapsed,
        "batch_per_rank": BATCH,
        "measured": "live tensor storages (peak of after forward/backward/step samples), worse rank",
        "settings": {n: {k: str(v) for k, v in overrides(n, 1024, 4).items()} for n in strategies},
    }
    status = finish("memory_sweep", rows, data, quick=args.quick)
    return 2 if failed else status


def _print_table(results: list[dict[str, Any]], rank_counts: list[int], strategies: list[str]) -> None:
    print("\nper-rank MiB: measured live tensors / planner estimate (est/meas); peak RSS growth below")
    for ranks in rank_counts:
        print(f"\n{ranks} ranks {'params':>8} " + "".join(f"{n:>27}" for n in strategies))
        for n in sorted({r["params"] for r in results if r["ranks"] == ranks}):
            cells = {r["strategy"]: r for r in results if r["ranks"] == ranks and r["params"] == n}
            line, rss = f"{'':8}{n / 1e6:>7.1f}M ", f"{'':8}{'peak RSS':>8} "
            for name in strategies:
                r = cells.get(name)
                if r is None:
                    line, rss = line + f"{'-':>27}", rss + f"{'':>27}"
                    continue
                meas, est = r["measured_live"] / MiB, r["estimate"]["total"] / MiB
                line += f"{f'{meas:.1f} / {est:.1f} ({est / meas:.2f})':>27}"
                peak = r["peak_rss_growth"] / MiB
                rss += f"{f'{peak:.1f} ({est / peak:.2f})':>27}"
            print(line)
            print(rss)


def _targets(results: list[dict[str, Any]]) -> list[Row]:
    """Sharded / ddp per-rank ratios at the largest size measured for both, and the planner's accuracy."""
    rows = []
    for ranks in sorted({r["ranks"] for r in results}):
        mine = {(r["strategy"], r["params"]): r["measured_live"] for r in results if r["ranks"] == ranks}
        for name, spread in (("fsdp", 16), ("deepspeed_stage_3", 20)):  # B/param summed over ranks, fp32 + Adam
            common = [n for s, n in mine if s == name and ("ddp", n) in mine]
            if common:
                n = max(common)
                rows.append(
                    Row(
                        f"{name} / ddp per-rank live bytes, {n / 1e6:.0f}M params, {ranks} ranks",
                        mine[name, n] / mine["ddp", n],
                        0.55 if ranks == 2 else 0.3,
                        "x",
                        note=f"arithmetic floor {spread / (16 * ranks):.3f}",
                    )
                )
    big = [r for r in results if r["params"] >= 10_000_000]  # below that, fixed costs of a few MB dominate
    for key, what in (("measured_live", "live tensors"), ("peak_rss_growth", "peak RSS growth")):
        if big:
            worst = max(big, key=lambda r: abs(r["estimate"]["total"] / r[key] - 1))
            miss = abs(worst["estimate"]["total"] / worst[key] - 1)
            where = f"{worst['strategy']} x{worst['ranks']} at {worst['params'] / 1e6:.0f}M: estimate/measured "
            rows.append(
                Row(
                    f"planner total vs {what}, worst |est/meas - 1|, >= 10M params",
                    miss,
                    0.10,
                    note=where + f"{worst['estimate']['total'] / worst[key]:.2f}",
                )
            )
    return rows


if __name__ == "__main__":
    sys.exit(main())
