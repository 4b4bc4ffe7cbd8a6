"""Train a model of a few MB for two steps per strategy on 2 ranks and measure what each rank holds.

Usage: python -m phalanx.testing.memory_probe OUT_DIR WIDTH[,WIDTH...] STRATEGY [STRATEGY ...]

Used by the conformance kit's memory check (:mod:`phalanx.testing.memory`) and by phalanx's own
estimate-vs-measured tests; the model is :class:`MeasuredNet` at the given width (512: about 1.2 MB
of float32 weights, large against the few hundred bytes of fixed per-run tensors).

The strategies run one after the other in the same processes (the launcher re-runs this script
once per extra rank, and every rank loops over the same list). After the second optimizer step
each rank walks every live tensor (``gc``), counts each storage once, and splits the bytes into
parameter storages, gradient storages, optimizer state (with the master weights a library
steps) and the rest (library buffers); the tensors that existed before the model was built (data, imports) are left out.
``peak`` is the largest total seen at the hooks of the step (after backward, after the step).
Rank r writes ``OUT_DIR/<strategy>-<width>-rank<r>.json``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import phalanx
from phalanx.callbacks import Callback


def build(width: int) -> nn.Module:
    """The measured model; also what the test plans on the meta device."""
    return MeasuredNet(width)


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


def _storage(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of a tensor's storage; None for meta / wrapper tensors without one."""
    if tensor.is_meta or type(tensor).__name__ == "DTensor":
        return None
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    if storage.data_ptr() == 0:
        return None
    return storage.data_ptr(), storage.nbytes()


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


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if type(tensor).__name__ == "DTensor" else tensor  # type: ignore[attr-defined]


def _pointers(tensors: list[torch.Tensor]) -> set[int]:
    found = set()
    for tensor in tensors:
        item = _storage(_local(tensor))
        if item is not None:
            found.add(item[0])
    return found


class Measure(Callback):
    """Measures at the second step's hooks, on every rank."""

    def __init__(self, baseline: set[int]) -> None:
        self.baseline = baseline
        self.result: dict[str, int] = {}
        self.peak = 0

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
            self.result = self._split(pl_module)
            self.peak = max(self.peak, self.result["total"])


__all__ = ["MeasuredNet", "build", "live_storages", "main"]


def main() -> None:
    out, widths, names = sys.argv[1], [int(w) for w in sys.argv[2].split(",")], sys.argv[3:]
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g))
    for width, name in [(width, name) for width in widths for name in names]:
        baseline = set(live_storages())
        model = build(width)
        measure = Measure(baseline)
        trainer = phalanx.Trainer(
            accelerator="cpu",
            strategy=name,
            devices=2,
            max_steps=2,
            callbacks=[measure],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
        )
        trainer.fit(model, DataLoader(data, batch_size=4))
        record = {**measure.result, "peak": measure.peak, "world_size": trainer.world_size}
        with open(os.path.join(out, f"{name}-{width}-rank{trainer.global_rank}.json"), "w") as fh:
            json.dump(record, fh)
        del trainer, model, measure
        gc.collect()


if __name__ == "__main__":
    main()
