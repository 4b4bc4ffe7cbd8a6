"""``phalanx doctor``'s tiny fit: a few SGD steps of linear regression under one strategy.

Copied next to its output by ``phalanx doctor`` and run as a script, because a strategy may
re-execute the script once per rank (``ddp``) or spawn workers that import it (``ddp_spawn``:
hence the Module at module level). Usage::

    python doctor_fit.py STRATEGY ACCELERATOR RESULT.json

A parallel strategy runs with 2 processes, any other with 1. Rank 0 writes the first and last
loss to ``RESULT.json`` when training ends; the doctor checks the loss went down.

One Module serves every strategy, so the doctor needs no per-plugin model and the core names no
plugin: :meth:`Regression.configure_model` reads the strategy's ``DeviceMesh`` (``None`` for
most) and, when the mesh has a ``tensor_parallel`` dimension of more than one rank (the
dimension name ``ModelParallelStrategy`` documents), splits the two Linears over it with
torch's own tensor-parallel plan, and ``fully_shard``-s over ``data_parallel`` when that has
more than one rank. A strategy that refuses an unsplit model is then served a split one, and
the result records what was split so the doctor can say so.

A strategy that needs its model prepared its own way (a vendor's pipeline or expert split, a mesh
with other dimension names) defines ``doctor_configure_model(model) -> str``: the doctor then hands
it the two-Linear ``torch.nn.Sequential`` instead of splitting it, shows the returned description
on the check's line, and still requires the loss to fall. No import, no registration: the method
is looked up on the strategy object, so a plugin without it changes nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from phalanx import Module, Trainer
from phalanx.registry import StrategyRegistry
from phalanx.strategies import ParallelStrategy

TENSOR_PARALLEL = "tensor_parallel"
DATA_PARALLEL = "data_parallel"
#: Optional strategy method that prepares the doctor's model itself (see the module docstring).
STRATEGY_HOOK = "doctor_configure_model"


def _mesh_size(mesh: Any, dim: str) -> int:
    """Ranks along ``dim`` of ``mesh``; 1 when the mesh has no such dimension (or no names)."""
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return int(mesh[dim].size()) if dim in names else 1


class Regression(Module):
    """y = x @ w through two Linears: the loss must fall within a few steps under any correct strategy.

    Two layers (4 -> 8 -> 1, no activation) rather than one so a tensor-parallel plan has a
    column-wise and a row-wise half, the standard Megatron pair, with 8 divisible by 2 ranks.
    """

    def __init__(self, result: Path) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        self.result = result
        self.losses: list[float] = []
        self.parallelism = ""
        self.by_strategy = False

    def configure_model(self) -> None:
        """Split the Linears over the mesh's ``tensor_parallel`` ranks, if the strategy has such a mesh.

        A no-op without a mesh (most strategies; planning on the meta device) or with a mesh that
        has no ``tensor_parallel`` dimension (FSDP's shard / replicate mesh): those strategies
        train this Module as it was built in ``__init__``. A strategy with ``doctor_configure_model``
        prepares the model itself, because only it knows what it needs.
        """
        if self.parallelism:
            return
        hook = getattr(self.trainer.strategy, STRATEGY_HOOK, None)
        if callable(hook):
            described = hook(self.net)
            self.parallelism = str(described or f"prepared by {type(self.trainer.strategy).__name__}.{STRATEGY_HOOK}")
            self.by_strategy = True
            return
        mesh = self.device_mesh
        if mesh is None:
            return
        tp_size, dp_size = _mesh_size(mesh, TENSOR_PARALLEL), _mesh_size(mesh, DATA_PARALLEL)
        if tp_size > 1:
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            parallelize_module(self.net, mesh[TENSOR_PARALLEL], {"0": ColwiseParallel(), "1": RowwiseParallel()})
            self.parallelism = f"tensor parallel x{tp_size}"
        if tp_size > 1 and dp_size > 1:
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.net, mesh=mesh[DATA_PARALLEL])
            self.parallelism += f", fully_shard x{dp_size}"

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def on_train_end(self) -> None:
        split = self._split_parameters()
        if self.global_rank == 0:
            world = self.trainer.world_size
            record = {
                "first": self.losses[0],
                "last": self.losses[-1],
                "world_size": world,
                "parallelism": self.parallelism,
                "split": split,
                "by_strategy": self.by_strategy,
            }
            self.result.write_text(json.dumps(record))

    def _split_parameters(self) -> list[str]:
        """Names of the parameters that really are DTensors sharded over ``tensor_parallel``.

        Proof rather than intent: the doctor fails a fit that claims tensor parallelism when no
        weight ended up sharded.
        """
        if not self.parallelism or self.by_strategy:
            return []
        from torch.distributed.tensor import DTensor, Shard

        split = []
        for name, param in self.named_parameters():
            if not isinstance(param, DTensor):
                continue
            dims = param.device_mesh.mesh_dim_names or ()
            if TENSOR_PARALLEL in dims and isinstance(param.placements[dims.index(TENSOR_PARALLEL)], Shard):
                split.append(name)
        return split


def main(strategy: str, accelerator: str, result: Path) -> None:
    """Fit :class:`Regression` for 12 steps under ``strategy`` (2 processes if it is parallel)."""
    torch.manual_seed(0)
    devices = 2 if issubclass(StrategyRegistry.get_class(strategy), ParallelStrategy) else 1
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    trainer = Trainer(
        accelerator=accelerator,
        strategy=strategy,
        devices=devices,
        max_steps=12,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=str(result.parent),
    )
    trainer.fit(Regression(result), DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
