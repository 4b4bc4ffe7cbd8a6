"""Training script the tests run in a subprocess (DeepSpeedStrategy re-runs it once per extra rank).

Modes:
    parity   Train with DeepSpeed (saving a checkpoint), validate the trained Module, then train the
             same model with a plain torch DistributedDataParallel loop in the same processes;
             write both loss curves.
    resume   Train N steps straight; train N/2 with ModelCheckpoint, resume from "last" to N in a new
             Trainer; write both loss curves.
    reload   Try to resume / evaluate a checkpoint given on the command line and report what
             happened (wrong-model and wrong-world-size checks); optionally train in bf16.
    variants Several fits in the same processes, one per ``--runs`` entry (see ``variants``).

Every rank writes ``<out>/rank<R>.json``; rank 0 also writes ``ref_weights.pt`` (parity).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from phalanx import Module, Trainer
from phalanx.callbacks import Callback, ModelCheckpoint
from phalanx.discovery import convert_checkpoint

LR = 0.05
BATCH = 4


def build_layers(hidden: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """Halve the learning rate every 2 optimizer steps (exercises scheduler stepping and resume)."""
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True) * 0.3 + 0.1 * torch.randn(64, 1, generator=generator)
    return TensorDataset(x, y)


class Net(Module):
    """A small regression MLP; layers built in __init__ or (``lazy``) in configure_model."""

    def __init__(self, hidden: int = 32, lazy: bool = False) -> None:
        super().__init__()
        self.hidden = hidden
        self.lazy = lazy
        self.layers: nn.Module | None = None if lazy else build_layers(hidden)
        self.losses: list[float] = []
        self.save_to: str | None = None
        self.local_numel = -1

    def configure_model(self) -> None:
        if self.layers is None:
            self.layers = build_layers(self.hidden)
            # Under ZeRO-3's zero.Init the layers are born partitioned: no local elements.
            self.local_numel = sum(p.numel() for p in self.layers.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.layers is not None
        return self.layers(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.losses.append(float(loss.detach().float()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y).float(), sync_dist=True)

    def on_train_end(self) -> None:
        # DeepSpeed saves collectively: inside the run, while the process group exists.
        if self.save_to:
            self.trainer.save_checkpoint(self.save_to)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.Adam(self.parameters(), lr=LR)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler(optimizer), "interval": "step"}}


def loader() -> DataLoader:
    return DataLoader(dataset(), batch_size=BATCH, shuffle=False)


def trainer(args: argparse.Namespace, steps: int, callbacks: list[Any] | None = None) -> Trainer:
    strategy = args.strategy
    if isinstance(strategy, dict):  # DeepSpeedStrategy keyword arguments
        from phalanx_strategy_deepspeed import DeepSpeedStrategy

        strategy = DeepSpeedStrategy(**strategy)
    return Trainer(
        callbacks=callbacks,
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        precision=args.precision,
        max_steps=steps,
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=args.clip or None,
        logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks or []),
        enable_progress_bar=False,
        default_root_dir=args.out,
    )


def reference(args: argparse.Namespace) -> list[float]:
    """The same run as plain torch: DDP over gloo, DistributedSampler, no_sync accumulation."""
    rank, world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    # An explicit store served by rank 0 (a tcp:// URL would, under torchrun, look for torchrun's
    # agent store instead), kept until every rank has destroyed its group.
    store = dist.TCPStore("127.0.0.1", args.ref_port, world, is_master=rank == 0, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        model = build_layers(args.hidden)
        ddp = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=LR)
        schedule = scheduler(optimizer)
        sampler = DistributedSampler(dataset(), num_replicas=world, rank=rank, shuffle=False, seed=0)
        data = DataLoader(dataset(), batch_size=BATCH, sampler=sampler)
        losses: list[float] = []
        steps, epoch = 0, 0
        while steps < args.steps:
            sampler.set_epoch(epoch)
            for index, (x, y) in enumerate(data):
                boundary = (index + 1) % args.accumulate == 0
                with nullcontext() if boundary else ddp.no_sync():
                    loss = F.mse_loss(ddp(x), y)
                    losses.append(float(loss.detach()))
                    (loss / args.accumulate).backward()
                if boundary:
                    if args.clip:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                    optimizer.step()
                    optimizer.zero_grad()
                    schedule.step()
                    steps += 1
                    if steps == args.steps:
                        break
            epoch += 1
        if rank == 0:
            torch.save(model.state_dict(), os.path.join(args.out, "ref_weights.pt"))
        dist.barrier()
        return losses
    finally:
        dist.destroy_process_group()
        store.add("destroyed", 1)
        while rank == 0 and store.add("destroyed", 0) < world:
            time.sleep(0.05)


def write(args: argparse.Namespace, rank: int, result: dict[str, Any]) -> None:
    with open(os.path.join(args.out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle)


def parity(args: argparse.Namespace) -> None:
    model = Net(args.hidden, lazy=args.lazy)
    model.save_to = os.path.join(args.out, "ckpt")
    run = trainer(args, args.steps)
    run.fit(model, loader())
    rank = run.global_rank
    if rank == 0:  # after fit the Module holds the trained weights (ZeRO-3: gathered at teardown)
        torch.save(model.state_dict(), os.path.join(args.out, "module_weights.pt"))
    # ... and runs again: a new engine in a new process group
    val_loss = float(run.validate(model, loader(), verbose=False)[0]["val_loss"])
    result = {"losses": model.losses, "ref": reference(args), "world": run.world_size, "numel": model.local_numel, "val_loss": val_loss}
    if rank == 0:  # what `phalanx checkpoint convert` runs, without starting another interpreter
        convert_checkpoint(model.save_to, os.path.join(args.out, "converted.ckpt"))
    write(args, rank, result)


def resume(args: argparse.Namespace) -> None:
    straight = Net(args.hidden, lazy=args.lazy)
    trainer(args, args.steps).fit(straight, loader())
    first = Net(args.hidden, lazy=args.lazy)
    # The usual path: ModelCheckpoint writes checkpoint directories, fit(ckpt_path="last") finds one.
    saver = ModelCheckpoint(dirpath=os.path.join(args.out, "checkpoints"), save_last=True, every_n_train_steps=args.steps // 2)
    trainer(args, args.steps // 2, callbacks=[saver]).fit(first, loader())
    second = Net(args.hidden, lazy=args.lazy)
    resumed = trainer(args, args.steps)
    resumed.fit(second, loader(), ckpt_path="last")
    write(args, resumed.global_rank, {"straight": straight.losses, "first": first.losses, "resumed": second.losses})


def _try_fit(args: argparse.Namespace, hidden: int) -> str:
    try:
        trainer(args, args.steps).fit(Net(hidden, lazy=args.lazy), loader(), ckpt_path=args.ckpt)
    except Exception as error:  # the test inspects the message
        return f"{type(error).__name__}: {error}"
    return "ok"


def reload(args: argparse.Namespace) -> None:
    """Fit from ``--ckpt`` with another model and with this one (both expected to fail when the
    world differs); validate from it; convert it; optionally train in bf16."""
    result: dict[str, Any] = {}
    if args.other_hidden:
        result["other"] = _try_fit(args, args.other_hidden)
    result["fit"] = _try_fit(args, args.hidden)
    convert_checkpoint(args.ckpt, os.path.join(args.out, "converted.ckpt"))
    if args.bf16_steps:
        model = Net(args.hidden, lazy=args.lazy)
        bf16 = argparse.Namespace(**{**vars(args), "precision": "bf16-mixed"})
        trainer(bf16, args.bf16_steps).fit(model, loader())
        result["bf16_losses"] = model.losses
        result["bf16_dtype"] = str(next(iter(model.parameters())).dtype)
    if args.validate:
        metrics = trainer(args, args.steps).validate(Net(args.hidden, lazy=args.lazy), loader(), ckpt_path=args.ckpt, verbose=False)
        result["val_loss"] = float(metrics[0]["val_loss"])
    write(args, 0, result)


def _wait_for(path: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:g}s")
        time.sleep(0.05)


class EngineFacts(Callback):
    """What the running engine was configured with, read from DeepSpeed itself at the end of fit."""

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        engine = trainer.strategy.deepspeed_engine
        self.facts = {"stage": engine.zero_optimization_stage(), "cpu_offload": bool(engine.zero_cpu_offload()), "bf16": engine.bfloat16_enabled()}


def variants(args: argparse.Namespace) -> None:
    """One fit per entry of ``--runs`` (a JSON list), all in these processes; results keyed by tag.

    Entry keys: ``tag``; ``strategy`` (a name or DeepSpeedStrategy kwargs); ``precision``;
    ``steps`` (max_steps); ``lazy``; ``ckpt`` (a file in ``--out`` to start from, waited for);
    ``validate`` (validate from ``ckpt`` instead of fitting); ``convert`` (save a checkpoint at the
    end, rank 0 converts it to ``<tag>.ckpt``); ``reuse`` (validate the same Module again
    afterwards and record what happened).
    """
    results: dict[str, Any] = {}
    rank = 0
    for run in json.loads(args.runs):
        tag = run["tag"]
        settings = argparse.Namespace(
            **{**vars(args), "strategy": run.get("strategy", args.strategy), "precision": run.get("precision", "32-true")}
        )
        model = Net(args.hidden, lazy=run.get("lazy", False))
        if run.get("convert"):
            model.save_to = os.path.join(args.out, tag)
        ckpt = os.path.join(args.out, run["ckpt"]) if run.get("ckpt") else None
        if ckpt:
            _wait_for(ckpt + ".done")
        facts = EngineFacts()
        fit = trainer(settings, run.get("steps", args.steps), callbacks=[facts])
        result: dict[str, Any] = {}
        if run.get("validate"):
            result["val_loss"] = float(fit.validate(model, loader(), ckpt_path=ckpt, verbose=False)[0]["val_loss"])
        else:
            fit.fit(model, loader(), ckpt_path=ckpt)
        rank = fit.global_rank
        parameters = list(model.parameters())
        result |= {
            "losses": model.losses,
            "dtype": str(parameters[0].dtype),
            "data_numel": sum(p.data.numel() for p in parameters),
            "partitioned": sum(hasattr(p, "ds_id") for p in parameters),  # still ZeRO-3 parameters
            "global_step": fit.global_step,
            "engine": facts.facts,
        }
        if rank == 0 and not run.get("lazy"):
            torch.save(model.state_dict(), os.path.join(args.out, f"{tag}.weights.pt"))
        if run.get("reuse"):
            try:
                trainer(settings, 1).validate(model, loader(), verbose=False)
                result["reuse"] = "ok"
            except Exception as error:  # the test inspects the message
                result["reuse"] = f"{type(error).__name__}: {error}"
        if run.get("convert") and rank == 0:
            convert_checkpoint(model.save_to, os.path.join(args.out, f"{tag}.ckpt"))
            open(os.path.join(args.out, f"{tag}.ckpt.done"), "w").close()
        results[tag] = result
    write(args, rank, results)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["parity", "resume", "reload", "variants"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", default="deepspeed_stage_2")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--clip", type=float, default=0.0)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lazy", action="store_true", help="build layers in configure_model")
    parser.add_argument("--ref-port", type=int, default=0)
    parser.add_argument("--ckpt")
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--other-hidden", type=int, default=0, help="reload: first try a model of this width")
    parser.add_argument("--bf16-steps", type=int, default=0, help="reload: also fit this many steps in bf16-mixed")
    parser.add_argument("--runs", default="[]", help="variants: a JSON list of runs")
    args = parser.parse_args()
    {"parity": parity, "resume": resume, "reload": reload, "variants": variants}[args.mode](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
