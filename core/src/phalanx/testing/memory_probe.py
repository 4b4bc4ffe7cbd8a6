"""Train a model of a few MB for two steps per strategy on 2 ranks and measure what each rank holds.

Usage: python -m phalanx.testing.memory_probe OUT_DIR WIDTH[,WIDTH...] STRATEGY [STRATEGY ...]

A width ``bN`` trains :class:`BlockNet` (repeated MLP blocks over token sequences, where
activations dominate) instead; a strategy ``NAME+ac`` passes
``activation_checkpointing_policy={Block}`` to it, ``NAME+bucket`` a small DeepSpeed reduce
bucket, ``NAME+dp`` a model_parallel mesh of data parallel only (:data:`STRATEGY_OPTIONS`);
``NAME+f8`` trains with ``precision="float8"`` (torchao's Float8Linear, :data:`PRECISION_OPTIONS`).

Used by the conformance kit's memory check (:mod:`phalanx.testing.memory`) and by phalanx's own
estimate-vs-measured tests; the model is :class:`MeasuredNet` at the given width (512: about 1.2 MB
of float32 weights, large against the few hundred bytes of fixed per-run tensors).

The strategies run one after the other in the same processes (the launcher re-runs this script
once per extra rank, and every rank loops over the same list). After the second optimizer step
each rank walks every live tensor (``gc``), counts each storage once, and splits the bytes into
parameter storages, gradient storages, optimizer state (with the master weights a library
steps) and the rest (library buffers); the tensors that existed before the model was built (data, imports) are left out.
``peak`` is the largest total seen at the hooks of the step (after backward, after the step).

``tracked_peak`` is the true peak of the second step: torch's ``MemTracker`` (a dispatch mode that
sees every tensor an operator creates or frees, entered before the model is built) is reset to the
bytes live when the step starts and read when it ends, so transients inside backward and the
optimizer step (gradient buckets, gathered shards, the optimizer's temporaries) are counted too;
``tracked_split`` is that peak by torch's categories (parameters, gradients, activations, temporaries,
optimizer state, buffers). Rank r writes ``OUT_DIR/<strategy>-<width>-rank<r>.json``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.data import DataLoader, TensorDataset

import phalanx
from phalanx.callbacks import Callback


def _blocks(width: int | str) -> tuple[int, int] | None:
    """(features, tokens) of a BlockNet spec: ``"b256"`` (64-token sequences) or ``"b256t16"``
    (16 tokens: the same model, a quarter of the activations and of the matmul time); None for
    MeasuredNet's plain width."""
    if not (isinstance(width, str) and width.startswith("b")):
        return None
    features, _, tokens = width[1:].partition("t")
    return int(features), int(tokens) if tokens else BlockNet.tokens


def build(width: int | str) -> nn.Module:
    """The measured model for a width spec (``512``: MeasuredNet, ``"b256"`` or ``"b256t16"``:
    BlockNet); also what the estimates plan on the meta device."""
    blocks = _blocks(width)
    return BlockNet(blocks[0]) if blocks else MeasuredNet(int(width))


def input_shape(width: int | str) -> tuple[int, ...] | None:
    """One rank's micro-batch shape for a width spec; None for MeasuredNet (its activations are
    a few KB: the estimates leave them out)."""
    blocks = _blocks(width)
    return (BATCH, blocks[1], blocks[0]) if blocks else None


BATCH = 4


class MeasuredNet(phalanx.Module):
    """Three linear layers (a few MB of float32), Adam: every part of the estimate is exercised."""

    def __init__(self, width: int = 512) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Block(nn.Module):
    """A transformer-style MLP block with a residual: what activation checkpointing recomputes."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


class BlockNet(phalanx.Module):
    """``depth`` Blocks over ``tokens``-long sequences of ``width`` features; AdamW."""

    tokens = 64
    depth = 4

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.width = width
        self.blocks = nn.ModuleList(Block(width) for _ in range(self.depth))

    def configure_model(self) -> None:
        """Under model_parallel (data parallel only), ``fully_shard`` each block, then the whole:
        the plan model_parallel's estimate assumes. Other strategies wrap the model themselves."""
        mesh = self.device_mesh
        if mesh is None or type(self.trainer.strategy).__name__ != "ModelParallelStrategy":
            return
        if any(type(p).__name__ == "DTensor" for p in self.parameters()):
            return
        from torch.distributed.fsdp import fully_shard

        for block in self.blocks:
            fully_shard(block, mesh=mesh["data_parallel"])
        fully_shard(self, mesh=mesh["data_parallel"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


#: The probe's strategy options: ``NAME+ac``, ``NAME+bucket`` (DeepSpeed's reduce bucket at 1M
#: elements instead of 200M, so that what the estimate says about the rest shows in the total) and
#: ``NAME+dp`` (model_parallel as data parallel x 2: the probe's models have no tensor-parallel plan).
STRATEGY_OPTIONS: dict[str, dict[str, Any]] = {
    "ac": {"activation_checkpointing_policy": {Block}},
    "bucket": {"reduce_bucket_size": 1_000_000},
    "dp": {"data_parallel_size": 2, "tensor_parallel_size": 1},
}


#: Spec options that choose the Trainer's precision instead of a strategy argument.
PRECISION_OPTIONS: dict[str, str] = {"f8": "float8"}


def strategy_params(spec: str) -> tuple[str, dict[str, Any]]:
    """``"fsdp+ac"`` -> ``("fsdp", {"activation_checkpointing_policy": {Block}})``; a plain name -> no params."""
    name, *options = spec.split("+")
    params: dict[str, Any] = {}
    for option in options:
        if option in PRECISION_OPTIONS:
            continue
        if option not in STRATEGY_OPTIONS:
            known = sorted([*STRATEGY_OPTIONS, *PRECISION_OPTIONS])
            msg = f"strategy spec {spec!r}: unknown option {option!r}; the probe knows {known}"
            raise ValueError(msg)
        params.update(STRATEGY_OPTIONS[option])
    return name, params


def spec_precision(spec: str) -> str:
    """The Trainer precision a strategy spec asks for: ``"fsdp+f8"`` -> ``"float8"``, else ``"32-true"``."""
    chosen = [PRECISION_OPTIONS[option] for option in spec.split("+")[1:] if option in PRECISION_OPTIONS]
    return chosen[-1] if chosen else "32-true"


def _storage(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of a tensor's storage; None for meta / wrapper tensors without one."""
    if tensor.is_meta or type(tensor).__name__ == "DTensor":
        return None
    try:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()  # a tensor subclass (torchao's float8) may have no real storage
    except (RuntimeError, NotImplementedError):
        return None
    if pointer == 0:
        return None
    return pointer, storage.nbytes()


def live_storages() -> dict[int, int]:
    """Every live tensor storage of this process, once: data pointer -> bytes."""
    gc.collect()
    found: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor):
                item = _storage(obj)
                if item is not None:
                    found[item[0]] = max(found.get(item[0], 0), item[1])
        except ReferenceError:
            continue
    return found


@contextlib.contextmanager
def saved_for_backward() -> Iterator[dict[int, int]]:
    """Inside the block, every storage autograd saves for backward, once: data pointer -> bytes.

    Parameters (leaves that require grad) are left out: what is counted is the activations.
    """
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not (tensor.is_leaf and tensor.requires_grad):
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield seen


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if type(tensor).__name__ == "DTensor" else tensor  # type: ignore[attr-defined]


def _pointers(tensors: list[torch.Tensor]) -> set[int]:
    found = set()
    for tensor in tensors:
        item = _storage(_local(tensor))
        if item is not None:
            found.add(item[0])
    return found


class PeakTracker(MemTracker):
    """torch's ``MemTracker`` with a peak that can be restarted at the current live bytes.

    Entered before the model is built, so every parameter, gradient, bucket and optimizer state
    the run creates is tracked from its allocation (by the operator that made it: a parameter
    counts as "Activation" here, a tensor made in backward as "Temp", one made in the optimizer
    step as "Optstate"; the total is what is compared). Its per-module records are switched off:
    a strategy that runs ``training_step`` through the wrapped module's forward calls the root
    module twice per step, which they refuse, and only the peak is read. ``restart_peak`` makes
    the live bytes the new peak. torch has no public call for either; the attributes used are
    the tracker's own hook registry and peak record.
    """

    def __enter__(self) -> PeakTracker:
        super().__enter__()
        self._mod_tracker.clear_user_hooks()
        return self

    def restart_peak(self) -> None:
        current = self.get_tracker_snapshot("current")
        self._peak_mem_snap = current
        self._peak_mem = {dev: snap["Total"] for dev, snap in current.items()}

    def peak(self) -> tuple[int, dict[str, int]]:
        """The peak since the last restart, in bytes, and its split by torch's categories."""
        snapshot = self.get_tracker_snapshot("peak")
        total = sum(snap["Total"] for snap in snapshot.values())
        split: dict[str, int] = {}
        for snap in snapshot.values():
            for kind, size in snap.items():
                if kind != "Total":
                    name = str(getattr(kind, "value", kind))
                    split[name] = split.get(name, 0) + size
        return total, split


class Measure(Callback):
    """Measures at the second step's hooks, on every rank."""

    def __init__(self, baseline: set[int], tracker: PeakTracker | None = None) -> None:
        self.baseline = baseline
        self.tracker = tracker
        self.result: dict[str, int] = {}
        self.peak = 0
        self.tracked: tuple[int, dict[str, int]] = (0, {})

    def on_train_batch_start(self, trainer: Any, pl_module: nn.Module, *args: Any) -> None:
        if self.tracker is not None and trainer.global_step == 1:
            self.tracker.restart_peak()

    def _split(self, module: nn.Module) -> dict[str, int]:
        live = {ptr: size for ptr, size in live_storages().items() if ptr not in self.baseline}
        params = [p.ds_tensor if hasattr(p, "ds_tensor") else p for p in module.parameters()]
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        # Optimizer state and the master weights a library steps instead of the module's own.
        optimizers = [obj for obj in gc.get_objects() if isinstance(obj, torch.optim.Optimizer)]
        masters = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
        grads += [p.grad for p in masters if p.grad is not None]
        states = [t for opt in optimizers for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        param_ptrs = _pointers(params)
        grad_ptrs = _pointers(grads) - param_ptrs
        state_ptrs = (_pointers(states) | _pointers(masters)) - param_ptrs - grad_ptrs
        split = {
            "parameters": sum(size for ptr, size in live.items() if ptr in param_ptrs),
            "gradients": sum(size for ptr, size in live.items() if ptr in grad_ptrs),
            "optimizer_states": sum(size for ptr, size in live.items() if ptr in state_ptrs),
            "total": sum(live.values()),
        }
        split["other"] = split["total"] - split["parameters"] - split["gradients"] - split["optimizer_states"]
        return split

    def on_after_backward(self, trainer: Any, pl_module: nn.Module) -> None:
        if trainer.global_step == 1:
            self.peak = max(self.peak, self._split(pl_module)["total"])

    def on_train_batch_end(self, trainer: Any, pl_module: nn.Module, *args: Any) -> None:
        if trainer.global_step == 2 and not self.result:
            if self.tracker is not None:
                self.tracked = self.tracker.peak()
            self.result = self._split(pl_module)
            self.peak = max(self.peak, self.result["total"])


__all__ = [
    "STRATEGY_OPTIONS",
    "Block",
    "BlockNet",
    "MeasuredNet",
    "PRECISION_OPTIONS",
    "PeakTracker",
    "build",
    "input_shape",
    "live_storages",
    "main",
    "saved_for_backward",
    "spec_precision",
    "strategy_params",
]


def main() -> None:
    from phalanx.registry import StrategyRegistry

    out, widths, names = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    g = torch.Generator().manual_seed(0)
    for width, name in [(width, name) for width in widths for name in names]:
        shape = input_shape(width)
        if shape is None:
            data = TensorDataset(torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g))
        else:
            data = TensorDataset(torch.randn(4 * shape[0], *shape[1:], generator=g))  # two steps on two ranks
        baseline = set(live_storages())
        tracker = PeakTracker().__enter__()
        model = build(width)
        measure = Measure(baseline, tracker)
        registered, params = strategy_params(name)
        trainer = phalanx.Trainer(
            accelerator="cpu",
            strategy=StrategyRegistry.get(registered, **params) if params else registered,
            devices=2,
            precision=spec_precision(name),
            max_steps=2,
            callbacks=[measure],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
        )
        try:
            trainer.fit(model, DataLoader(data, batch_size=BATCH))
        finally:
            tracker.__exit__(None, None, None)
        tracked_peak, tracked_split = measure.tracked
        record = {
            **measure.result,
            "peak": measure.peak,
            "tracked_peak": tracked_peak,
            "tracked_split": tracked_split,
            "world_size": trainer.world_size,
        }
        with open(os.path.join(out, f"{name}-{width}-rank{trainer.global_rank}.json"), "w") as fh:
            json.dump(record, fh)
        del trainer, model, measure, tracker
        gc.collect()


if __name__ == "__main__":
    main()
