"""A small Llama-style model trained with 2-D parallelism (tensor parallel x FSDP2) in Lightning's API.

The model is created on the meta device (``trainer.init_module(empty_init=True)``) and
parallelised in ``configure_model`` over the strategy's device mesh: tensor parallelism with
sequence parallelism inside each group of ``tensor_parallel`` ranks, activation checkpointing per
block, then ``fully_shard`` over the ``data_parallel`` dimension. The output layer keeps its
logits sharded by vocabulary and the loss is computed under ``loss_parallel()``, so the
``backward`` hook is overridden to run inside it too.

Global rank 0 writes the full initial weights to ``--init-out`` (a torch file) and to ``--out``
(JSON) the loss and the sample indices of every rank at every step, the final full-weight checksum
and the time. The tests replay the same steps on the same samples in plain PyTorch from those
initial weights and compare the losses.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.utils.data import DataLoader, Dataset

VOCAB = 64
DIM = 32
HEADS = 4
LAYERS = 2
HIDDEN = 64
SEQ = 16
SAMPLES = 64
BATCH = 4  # per data-parallel rank
LR = 1e-2


class TokenDataset(Dataset):
    """Sequences that count upwards modulo ``VOCAB`` from a random start: learnable in a few steps."""

    def __init__(self, samples: int, seq: int, seed: int) -> None:
        starts = torch.randint(0, VOCAB, (samples, 1), generator=torch.Generator().manual_seed(seed))
        self.tokens = (starts + torch.arange(seq + 1)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        row = self.tokens[index]
        return index, row[:-1], row[1:]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, seq, heads, head_dim), computed from positions."""
    seq, half = x.shape[1], x.shape[-1] // 2
    freqs = 1.0 / (10000.0 ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    angles = torch.arange(seq, device=x.device, dtype=torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds HEADS / tp of them
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q), rotary(k)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = RMSNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Plain PyTorch: the tests build this same module for their single-process reference."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def parallelize(model: Transformer, mesh: object) -> None:
    """Tensor + sequence parallel over mesh["tensor_parallel"], checkpointing, FSDP2 over mesh["data_parallel"]."""
    tp_mesh, dp_mesh = mesh["tensor_parallel"], mesh["data_parallel"]
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        },
    )
    for index, block in enumerate(model.layers):
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            },
        )
        model.layers[index] = checkpoint_wrapper(block)
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight as a full (unsharded) CPU tensor; a collective: every rank must call it."""
    state = {}
    for name, value in module.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        state[name] = value.detach().cpu().clone()
    return state


class LlamaModule(pl.LightningModule):
    def __init__(self, init_out: str | None = None) -> None:
        super().__init__()
        self.model = Transformer()
        self.init_out = init_out
        self.step_losses: list[torch.Tensor] = []
        self.step_samples: list[torch.Tensor] = []

    def configure_model(self) -> None:
        if isinstance(self.model.output.weight, DTensor):  # already parallelised (a second fit/test)
            return
        parallelize(self.model, self.device_mesh)

    def on_train_start(self) -> None:
        state = full_state(self.model)
        if self.global_rank == 0 and self.init_out:
            torch.save(state, self.init_out)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        samples, inputs, labels = batch
        self.step_samples.append(samples.detach().clone())
        logits = self.model(inputs)
        with loss_parallel():
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        local = loss.full_tensor() if isinstance(loss, DTensor) else loss
        self.step_losses.append(local.detach().clone())
        self.log("train_loss", local.detach(), prog_bar=True)
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        with loss_parallel():
            loss.backward()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=LR, foreach=False)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TokenDataset(SAMPLES, SEQ, seed=7), batch_size=BATCH)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--data-parallel", type=int, default=2)
    parser.add_argument("--tensor-parallel", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--root", default=".")
    parser.add_argument("--out", required=True, help="JSON file for the results (written by global rank 0)")
    parser.add_argument("--init-out", default=None, help="torch file for the full initial weights (rank 0)")
    return parser.parse_args()


def run() -> None:
    args = parse_args()
    start = time.perf_counter()
    pl.seed_everything(11)
    strategy = ModelParallelStrategy(data_parallel_size=args.data_parallel, tensor_parallel_size=args.tensor_parallel)
    trainer = pl.Trainer(
        default_root_dir=args.root,
        accelerator=args.accelerator,
        devices=args.data_parallel * args.tensor_parallel,
        strategy=strategy,
        max_steps=args.steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        logger=False,
    )
    with trainer.init_module(empty_init=True):
        model = LlamaModule(init_out=args.init_out)
    trainer.fit(model)

    per_rank = model.all_gather(torch.stack(model.step_losses))  # (world, steps): each rank's loss of its batch
    samples = model.all_gather(torch.stack(model.step_samples))  # (world, steps, batch): which samples it read
    checksum = float(sum(value.double().sum() for value in full_state(model.model).values()))
    trainer.print(f"losses per step (mean over ranks): {per_rank.mean(0).tolist()}")
    if trainer.is_global_zero:
        result = {
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "losses": per_rank.mean(0).tolist(),
            "rank_losses": per_rank.tolist(),
            "rank_samples": samples.tolist(),
            "checksum": checksum,
            "finite": math.isfinite(checksum),
            "seconds": time.perf_counter() - start,
        }
        Path(args.out).write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    run()
