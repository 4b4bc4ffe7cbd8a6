"""Context parallel: activation memory per rank and step time vs sequence length, cp 1 / 2 / 4.

Run:  python benchmarks/bench_cp_memory.py [--lengths 256 512 1024 2048 4096] [--dim 64] [--quick]

A small causal transformer (``--blocks`` pre-norm blocks, ``--heads`` heads of ``--dim / --heads``,
``F.scaled_dot_product_attention(is_causal=True)``, learned positions through
``context_parallel_positions``) trains with ``Trainer(strategy=ModelParallelStrategy(
context_parallel_size=cp))`` on ``cp`` CPU processes (gloo), one batch of ``--batch`` sequences
per length, each length twice (the second step is the one timed).

Activation memory is measured exactly, not sampled: a ``torch.autograd.graph.saved_tensors_hooks``
pack hook around each training step (``phalanx.testing.memory_probe.saved_for_backward``) adds up the bytes of every distinct storage autograd keeps
for the backward (parameters excluded: leaf tensors that require grad), on every rank; the table
shows the largest rank. Under cp these include the all-gathered keys and values and the
zero-padded queries of each rank's late chunk, which grow with the whole length, not ``L / cp``. Step time is the wall time from
``on_train_batch_start`` to ``on_train_batch_end`` on rank 0 (forward, backward, optimizer; the
cp collectives included). Targets: cp 2 at most 0.80 and cp 4 at most 0.55 of cp 1 at the longest
length: everything but attention divides by cp, while the gathered keys and values and the padded
queries of each rank's late chunk stay proportional to the whole length. ``--quick`` (what ``run_all.py --quick`` runs): cp 1 and 2, two short
lengths, nothing recorded.

Beside each measurement, the planner's estimate for the same model and mesh (``phalanx plan
--input-shape B,L --param context_parallel_size=cp``: the model traced on the meta device, its
attention calls as fused kernels, everything but attention divided by cp), held to 10 % of the
measured bytes at the longest length.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _bench import Row, child_env, finish


def _build(args: argparse.Namespace) -> Any:
    """The benchmark's causal transformer (a ``phalanx.Module`` subclass adds the step)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    import phalanx
    from phalanx_strategy_model_parallel import context_parallel_positions

    vocab, dim, heads = 256, args.dim, args.heads

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = (t.view(b, s, heads, -1).transpose(1, 2) for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, dim)
            x = x + self.out(a)
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    class LM(phalanx.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max(args.lengths), dim)
            self.blocks = nn.ModuleList([Block() for _ in range(args.blocks)])
            self.head = nn.Linear(dim, vocab)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens) + self.pos(context_parallel_positions(tokens.shape[1], tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return LM


def _estimated_mb(args: argparse.Namespace, cp: int, length: int) -> float:
    """The planner's activations per rank (``phalanx plan --input-shape B,L --param context_parallel_size=cp``).

    The trace counts the model's output (the logits), which stands for the log-probabilities the
    loss saves (the same size)."""
    from phalanx.memory import MemoryRequest
    from phalanx.model_shapes import build_on_meta, summarize_model
    from phalanx.planning import estimate_memory
    from phalanx.registry import StrategyRegistry

    entry = StrategyRegistry.entry("model_parallel")
    summary = summarize_model(build_on_meta(_build(args)), input_shape=(args.batch, length))
    params = {**entry.init_params, "data_parallel_size": 1, "tensor_parallel_size": 1, "context_parallel_size": cp}
    found = estimate_memory(MemoryRequest("model_parallel", entry.target_path, params, summary, devices=cp))
    assert found is not None and found.activations is not None
    return found.activations / 1e6


def _worker(args: argparse.Namespace) -> None:
    import time

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset

    import phalanx
    from phalanx.callbacks import Callback
    from phalanx.testing.memory_probe import saved_for_backward
    from phalanx_strategy_model_parallel import ModelParallelStrategy

    vocab, model_class = 256, _build(args)

    class LM(model_class):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            torch.manual_seed(0)
            super().__init__()
            self.saved: list[int] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            tokens, targets = batch
            with saved_for_backward() as seen:
                loss = F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten())
            self.saved.append(sum(seen.values()))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Batches(Dataset):
        """One whole batch per item: each length twice, in increasing order."""

        def __len__(self) -> int:
            return 2 * len(args.lengths)

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            length = args.lengths[index // 2]
            tokens = torch.randint(0, vocab, (args.batch, length + 1), generator=torch.Generator().manual_seed(index))
            return tokens[:, :-1], tokens[:, 1:]

    class Timer(Callback):
        def __init__(self) -> None:
            self.start, self.seconds = 0.0, []

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.seconds.append(time.perf_counter() - self.start)

    timer = Timer()
    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1, context_parallel_size=args.cp)
    trainer = phalanx.Trainer(
        accelerator="cpu",
        devices=args.cp,
        strategy=strategy,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[timer],
    )
    model = LM()
    trainer.fit(model, DataLoader(Batches(), batch_size=None))
    with open(f"{args.out}.rank{trainer.global_rank}", "w") as handle:
        json.dump({"saved": model.saved[1::2], "seconds": timer.seconds[1::2]}, handle)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.out:
        args.cp = args.cp[0]
        _worker(args)
        return 0
    if args.quick:
        args.lengths, args.cp = [32, 64], [1, 2]
    results: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cp in args.cp:
            out = os.path.join(tmp, f"cp{cp}")
            command = [sys.executable, os.path.abspath(__file__), "--out", out, "--cp", str(cp), "--dim", str(args.dim),
                       "--heads", str(args.heads), "--blocks", str(args.blocks), "--batch", str(args.batch),
                       "--lengths", *map(str, args.lengths)]  # fmt: skip
            subprocess.run(command, env=child_env(PYTHONWARNINGS="ignore"), check=True, stdout=subprocess.DEVNULL)
            ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(cp)]
            results[cp] = {
                "saved_mb": [max(r["saved"][i] for r in ranks) / 1e6 for i in range(len(args.lengths))],
                "seconds": ranks[0]["seconds"],
                "estimated_mb": [_estimated_mb(args, cp, length) for length in args.lengths],
            }
    print(f"model: {args.blocks} blocks, dim {args.dim}, {args.heads} heads, batch {args.batch}; CPU, gloo")
    header = (f"{'cp' + str(cp) + ' MB':>10} {'x cp1':>6} {'plan':>5} {'s':>7}" for cp in args.cp)
    print(f"{'L':>6} " + " ".join(header) + "   (plan: the planner's estimate / measured)")
    for i, length in enumerate(args.lengths):
        cells = []
        for cp in args.cp:
            mb, sec, est = results[cp]["saved_mb"][i], results[cp]["seconds"][i], results[cp]["estimated_mb"][i]
            cells.append(f"{mb:>10.2f} {mb / results[args.cp[0]]['saved_mb'][i]:>6.2f} {est / mb:>5.2f} {sec:>7.3f}")
        print(f"{length:>6} " + " ".join(cells))
    last = len(args.lengths) - 1
    base = results[args.cp[0]]["saved_mb"][last]
    rows = [
        Row(f"activations per rank, cp {cp} / cp 1 at L={args.lengths[last]}", results[cp]["saved_mb"][last] / base,
            bound, note="saved-for-backward bytes, largest rank")
        for cp, bound in ((2, 0.80), (4, 0.55))
        if cp in results
    ]  # fmt: skip
    rows += [
        Row(f"|planner estimate / measured - 1|, cp {cp} at L={args.lengths[last]}",
            abs(results[cp]["estimated_mb"][last] / results[cp]["saved_mb"][last] - 1), 0.10,
            note="phalanx plan's activations per rank vs the saved bytes")
        for cp in args.cp
    ]  # fmt: skip
    data = {"lengths": args.lengths, "results": {str(k): v for k, v in results.items()},
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "quick")}}  # fmt: skip
    status = finish("cp_memory", rows, data, quick=args.quick)
    if not args.quick:
        _plot(args.lengths, results)
    return status


def _plot(lengths: list[int], results: dict[int, dict[str, list[float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, sec) = plt.subplots(1, 2, figsize=(9, 3.4))
    for cp, values in results.items():
        mem.plot(lengths, values["saved_mb"], marker="o", label=f"cp {cp}")
        sec.plot(lengths, values["seconds"], marker="o", label=f"cp {cp}")
    for ax, label in ((mem, "activation memory per rank (MB)"), (sec, "step time, CPU (s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(Path(__file__).resolve().parent.parent / "docs" / "img" / "bench_cp_memory.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
