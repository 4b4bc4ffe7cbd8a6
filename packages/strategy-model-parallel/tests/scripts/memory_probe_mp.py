"""Train the memory probe's model under ModelParallelStrategy meshes and count what each rank holds.

``python memory_probe_mp.py OUT WIDTH[,WIDTH...] DP,TP [DP,TP ...]``: one fit of two AdamW steps
per (width, mesh), in the same processes. The model is core's :class:`~phalanx.testing.memory_probe.MeasuredNet`
(three Linears) whose ``configure_model`` splits every Linear over ``tensor_parallel``
(column-wise, row-wise, column-wise with a replicated output) and then ``fully_shard``-s each
Linear and the stack over ``data_parallel``: the plan the estimator assumes.

The counting is core's probe's own (:class:`~phalanx.testing.memory_probe.Measure`): every live
tensor storage once by data pointer, a DTensor through its local shard, split into parameters,
gradients and optimizer state after the second step, the peak at that step's hooks, and the step's
true peak (``tracked_peak``, torch's MemTracker through :class:`~phalanx.testing.memory_probe.PeakTracker`). Rank r
writes ``OUT/w<WIDTH>-dp<DP>-tp<TP>-rank<r>.json``.
"""

from __future__ import annotations

import gc
import json
import os
import sys

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset

import phalanx
from phalanx.testing.memory_probe import Measure, MeasuredNet, PeakTracker, live_storages
from phalanx_strategy_model_parallel import ModelParallelStrategy

#: Every Linear of ``MeasuredNet.layers`` split; the last one gathers its output for the loss.
LINEARS = (0, 2, 4)


class TensorParallelNet(MeasuredNet):
    """``MeasuredNet`` that parallelizes itself on the strategy's mesh (TP, then FSDP2 per Linear)."""

    def configure_model(self) -> None:
        mesh = self.device_mesh
        # No mesh: planning builds the model on the meta device without a trainer (the estimate
        # wants the unsplit shapes). Already DTensors: a second fit of the same Module.
        if mesh is None or isinstance(self.layers[0].weight, DTensor):
            return
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel(), "4": ColwiseParallel(output_layouts=Replicate())}
        parallelize_module(self.layers, mesh["tensor_parallel"], plan)
        for index in LINEARS:
            fully_shard(self.layers[index], mesh=mesh["data_parallel"])
        fully_shard(self.layers, mesh=mesh["data_parallel"])


def measure_mesh(out: str, width: int, dp: int, tp: int, data: TensorDataset) -> None:
    """One fit of two steps on a (dp, tp) mesh; this rank's record to ``OUT/w<width>-dp<dp>-tp<tp>-rank<r>.json``."""
    baseline = set(live_storages())
    tracker = PeakTracker().__enter__()
    model, measure = TensorParallelNet(width), Measure(baseline, tracker)
    strategy = ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp)
    trainer = phalanx.Trainer(accelerator="cpu", strategy=strategy, devices=dp * tp, max_steps=2, callbacks=[measure],
                              logger=False, enable_checkpointing=False, enable_progress_bar=False)
    try:
        trainer.fit(model, DataLoader(data, batch_size=4))
    finally:
        tracker.__exit__(None, None, None)
    record = {**measure.result, "peak": measure.peak, "tracked_peak": measure.tracked[0], "world_size": trainer.world_size}
    with open(os.path.join(out, f"w{width}-dp{dp}-tp{tp}-rank{trainer.global_rank}.json"), "w") as handle:
        json.dump(record, handle)
    del trainer, model, measure, strategy, tracker
    gc.collect()


def main() -> None:
    out, widths = sys.argv[1], [int(width) for width in sys.argv[2].split(",")]
    meshes = [tuple(int(size) for size in mesh.split(",")) for mesh in sys.argv[3:]]
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 64, generator=generator), torch.randn(32, 8, generator=generator))
    for width in widths:
        for dp, tp in meshes:
            measure_mesh(out, width, dp, tp, data)


if __name__ == "__main__":
    main()
