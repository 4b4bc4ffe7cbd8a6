"""Train a tiny character-level transformer with phalanx, on any installed strategy.

    python examples/demo.py                                   # one CPU process, a few hundred steps
    python examples/demo.py --strategy ddp --devices 2        # two processes over gloo
    python examples/demo.py --precision bf16-mixed --max-steps 200
    python examples/demo.py --compare                         # single_device, ddp and fsdp side by side

The model learns to continue the text in ``examples/data/``. The same script runs unchanged under
every strategy: with ``ddp`` it is re-executed once per rank, which is why everything lives under
``if __name__ == "__main__":`` and only global rank 0 prints. ``--compare`` runs this script once
per strategy (see ``examples/compare.py``) and prints one table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "harbour_notes.txt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line: the Trainer's hardware options plus a few model knobs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="auto", help="a registered strategy name (see `phalanx strategies`)")
    parser.add_argument("--devices", default="1", help='process/device count, "auto" or indices like "0,1"')
    parser.add_argument("--accelerator", default="cpu", help='"cpu", "cuda", "mps" or "auto"')
    parser.add_argument(
        "--precision", default="32-true", help="32-true, 64-true, 16-mixed, bf16-mixed, 16-true, bf16-true"
    )
    parser.add_argument("--max-steps", type=int, default=300, help="optimizer steps to train")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=32, help="characters of context")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA, help="a UTF-8 text file")
    parser.add_argument("--root-dir", default=".", help="where lightning_logs/ is written")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads per process (a tiny model runs fastest on one)"
    )
    parser.add_argument("--no-progress-bar", action="store_true")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout probability in the transformer layers")
    parser.add_argument(
        "--no-shuffle", action="store_true", help="read the windows in order (every strategy then sees the same batches)"
    )
    parser.add_argument("--report", type=Path, help="write each rank's losses and peak memory to REPORT.rank<N>.json")
    parser.add_argument(
        "--compare",
        nargs="*",
        metavar="STRATEGY",
        help="train under each STRATEGY (default: single_device ddp fsdp; parallel ones on 2 processes) and print a table",
    )
    return parser.parse_args(argv)


def peak_memory_mb(device: Any) -> float:
    """This process's peak memory in MB: CUDA's allocator peak on a GPU, else the peak resident set."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def _devices(value: str) -> Any:
    return int(value) if value.lstrip("-").isdigit() else value


if __name__ == "__main__":
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    from phalanx import Module, Trainer

    args = parse_args()
    if args.compare is not None:
        sys.path.insert(0, str(Path(__file__).parent))
        from compare import compare

        sys.exit(compare(Path(__file__), args))

    class CharWindows(Dataset):
        """Overlapping windows of ``block_size + 1`` characters: input and next-character target."""

        def __init__(self, ids: torch.Tensor, block_size: int) -> None:
            self.ids, self.block_size = ids, block_size
            self.starts = range(0, len(ids) - block_size - 1, block_size // 2)

        def __len__(self) -> int:
            return len(self.starts)

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            chunk = self.ids[self.starts[index] : self.starts[index] + self.block_size + 1]
            return chunk[:-1], chunk[1:]

    class CharTransformer(Module):
        """A two-layer causal transformer over characters."""

        def __init__(self, vocab_size: int, block_size: int, max_steps: int, dropout: float) -> None:
            super().__init__()
            width = 64
            self.token = nn.Embedding(vocab_size, width)
            self.position = nn.Embedding(block_size, width)
            layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=dropout, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab_size)
            self.max_steps = max_steps
            causal = torch.ones(block_size, block_size, dtype=torch.bool).triu(diagonal=1)  # True = may not attend
            self.register_buffer("mask", causal, persistent=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            length = ids.size(1)
            positions = torch.arange(length, device=ids.device)
            hidden = self.token(ids) + self.position(positions)
            hidden = self.blocks(hidden, mask=self.mask[:length, :length], is_causal=True)
            return self.head(self.norm(hidden))

        def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            ids, targets = batch
            logits = self(ids)
            return nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = self._loss(batch)
            self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self._loss(batch), prog_bar=True, sync_dist=True)

        def configure_optimizers(self) -> Any:
            # float16 weights ("16-true") cannot represent Adam's default eps=1e-8; use a larger one there
            eps = 1e-4 if self.dtype == torch.float16 else 1e-8
            optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.01, eps=eps)
            warmup = max(1, self.max_steps // 10)

            def schedule(step: int) -> float:  # linear warmup, then cosine decay to 10%
                if step < warmup:
                    return (step + 1) / warmup
                progress = (step - warmup) / max(1, self.max_steps - warmup)
                return 0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0)))

            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

        @torch.no_grad()
        def sample(self, prompt: torch.Tensor, length: int, temperature: float = 0.7) -> torch.Tensor:
            """Continue ``prompt`` (ids) by ``length`` characters, sampling with a fixed seed."""
            self.eval()
            generator = torch.Generator().manual_seed(0)
            ids = prompt.clone()
            for _ in range(length):
                window = ids[-self.position.num_embeddings :].unsqueeze(0).to(self.device)
                logits = self(window)[0, -1].float().cpu() / temperature
                ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=generator)])
            return ids[len(prompt) :]

    # FSDP2 warns whenever a wrapped forward returns a view (a Linear on 3-D input does); this model
    # never modifies its outputs in place, which is what the warning is about.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    text = args.data.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    encode = {ch: i for i, ch in enumerate(vocab)}
    ids = torch.tensor([encode[ch] for ch in text], dtype=torch.long)
    split = int(len(ids) * 0.9)
    train_data = DataLoader(
        CharWindows(ids[:split], args.block_size), batch_size=args.batch_size, shuffle=not args.no_shuffle, drop_last=True
    )
    val_data = DataLoader(CharWindows(ids[split:], args.block_size), batch_size=args.batch_size)

    model = CharTransformer(len(vocab), args.block_size, args.max_steps, args.dropout)
    val_every = max(1, args.max_steps // 3)
    trainer = Trainer(
        accelerator=args.accelerator,
        strategy=args.strategy,
        devices=_devices(args.devices),
        precision=args.precision,
        max_steps=args.max_steps,
        val_check_interval=val_every,
        check_val_every_n_epoch=None,
        log_every_n_steps=10,
        enable_checkpointing=False,
        enable_progress_bar=not args.no_progress_bar,
        default_root_dir=args.root_dir,
    )
    if trainer.is_global_zero:
        print(
            f"phalanx demo: {len(text):,} characters, vocabulary {len(vocab)}, "
            f"{sum(p.numel() for p in model.parameters()):,} parameters, strategy={trainer.strategy_name}, "
            f"devices={trainer.num_devices}, precision={trainer.precision}"
        )
    start = time.perf_counter()
    trainer.fit(model, train_data, val_data)
    elapsed = time.perf_counter() - start
    if trainer.is_global_zero:
        metrics = trainer.callback_metrics
        train_loss = metrics.get("train_loss_epoch", metrics.get("train_loss_step"))
        val_loss = metrics.get("val_loss")
        shown = {
            name: f"{float(value):.3f}"
            for name, value in (("train_loss", train_loss), ("val_loss", val_loss))
            if value is not None
        }
        # Only trainer.fit is timed here; --compare's "wall time" column also counts the
        # interpreter, the torch import and the launch of every process, so it is larger.
        print(
            f"trainer.fit took {elapsed:.1f} s (training + validation; start-up and process launch not included): "
            + ", ".join(f"{k}={v}" for k, v in shown.items())
            + f" (chance level {math.log(len(vocab)):.3f})"
        )
    if args.report is not None:
        metrics = trainer.callback_metrics
        report = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "train_loss": float(metrics.get("train_loss_epoch", metrics.get("train_loss_step", float("nan")))),
            "val_loss": float(metrics.get("val_loss", float("nan"))),
            "fit_seconds": elapsed,
            "peak_memory_mb": peak_memory_mb(trainer.strategy.root_device),
        }
        Path(f"{args.report}.rank{trainer.global_rank}.json").write_text(json.dumps(report))
    # Every rank samples: with a sharded strategy (fsdp) each forward gathers parameters collectively.
    # Every run draws from the same seeded generator, so equal weights give equal text; weights that
    # differ in the last digits (one process sums a batch's gradient in another order than two
    # processes averaging theirs) can tip one draw, and the texts part from that character on.
    model.float()
    prompt = ids[split : split + args.block_size]
    continuation = model.sample(prompt, 120)
    if trainer.is_global_zero:
        print("sample (seed 0, temperature 0.7):", repr("".join(vocab[int(i)] for i in continuation)))
