"""DDP features checked in real 2-rank runs, forked from this one process (one torch import).

Usage: python features.py OUT_DIR
Each scenario's workers write OUT_DIR/<scenario>.rank<r>.json from inside the run; the main
process writes OUT_DIR/main.json with what it saw (errors, the "auto" choice).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from common import PhalanxNet, loader, state_to_lists, trainer_kwargs, write_json
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

import phalanx
from phalanx.strategies import DDPStrategy

OUT = sys.argv[1] if len(sys.argv) > 1 else "."


def _pg_timeout_seconds() -> float:
    """The timeout the default process group was created with (read back from its gloo backend)."""
    group = dist.group.WORLD
    assert group is not None
    return float(group._get_backend(torch.device("cpu")).options._timeout.total_seconds())


class Recorder(PhalanxNet):
    """Writes facts about the running strategy at the end of training, on every rank."""

    scenario = "base"

    def facts(self) -> dict[str, Any]:
        model = self.trainer.strategy.model
        return {
            "wrapper": type(model).__name__,
            "is_ddp": isinstance(model, DistributedDataParallel),
            "find_unused_parameters": getattr(model, "find_unused_parameters", None),
            "static_graph": getattr(model, "static_graph", None),
            "gradient_as_bucket_view": getattr(model, "gradient_as_bucket_view", None),
            "backend": dist.get_backend(),
            "pg_timeout_s": _pg_timeout_seconds(),
            "weights": [p.detach().flatten().tolist() for p in self.parameters()],
            "initial": self._initial,
            "final": state_to_lists(self.state_dict()),
            "threads": torch.get_num_threads(),
        }

    def on_train_start(self) -> None:
        self._initial = state_to_lists(self.state_dict())  # after DDP's broadcast from rank 0

    def on_train_end(self) -> None:
        write_json(os.path.join(OUT, f"{self.scenario}.rank{self.trainer.global_rank}.json"), self.facts())


class Unused(Recorder):
    scenario = "unused"

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Linear(8, 8)


class WithBatchNorm(Recorder):
    scenario = "syncbn"

    def __init__(self) -> None:
        super().__init__()
        self.net.insert(1, nn.BatchNorm1d(16))

    def facts(self) -> dict[str, Any]:
        return {"syncbn": any(isinstance(m, nn.SyncBatchNorm) for m in self.trainer.strategy.model.modules())}


def counting_hook(state: dict[str, int], bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """An all-reduce (mean) hook that counts its calls in ``state``."""
    state["calls"] = state.get("calls", 0) + 1
    tensor = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])


# DDP checks a hook's annotations at runtime; with postponed (string) annotations it would refuse.
counting_hook.__annotations__ = {"state": dict, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


class Hooked(Recorder):
    scenario = "hook"

    def facts(self) -> dict[str, Any]:
        strategy = self.trainer.strategy
        return {
            **super().facts(),
            "calls": strategy._ddp_comm_state["calls"] if strategy._ddp_comm_state else HOOK_STATE["calls"],
        }


HOOK_STATE: dict[str, int] = {"calls": 0}


class RegisteredHook(Hooked):
    scenario = "registered_hook"


class MyCustomDistributedDataParallel(DistributedDataParallel):
    pass


class CustomDDPStrategy(DDPStrategy):
    """The docs' custom strategy: own DDP wrapper, own setup touching accelerator and precision."""

    def configure_ddp(self) -> None:
        model: nn.Module = self.model  # type: ignore[has-type,assignment]  # mypy loses the property here
        self.model = MyCustomDistributedDataParallel(model, device_ids=self.determine_ddp_device_ids())

    def setup(self, trainer: Any) -> None:
        self.accelerator.setup(trainer)  # type: ignore[union-attr]
        super().setup(trainer)
        self.precision_plugin.connect(self.model, self.optimizers)


class Custom(Recorder):
    scenario = "custom"


class Collectives(Recorder):
    scenario = "collectives"

    def on_train_start(self) -> None:
        s = self.trainer.strategy
        rank = s.global_rank
        x = torch.tensor([float(rank + 1)], requires_grad=True)
        gathered = s.all_gather(x, sync_grads=True)
        gathered.sum().backward()
        s.barrier("check")
        # Gradients of a rank-specific loss: kept local inside block_backward_sync, averaged outside.
        weight = self.net[0].weight
        scale = float(rank + 1)
        with s.block_backward_sync():
            s.model(torch.ones(2, 8)).sum().mul(scale).backward()
        local = s.all_gather(weight.grad.clone())
        weight.grad = None
        s.model(torch.ones(2, 8)).sum().mul(scale).backward()
        synced = s.all_gather(weight.grad.clone())
        self.zero_grad(set_to_none=True)
        self._facts = {
            "all_gather": s.all_gather(torch.tensor([rank, 10 + rank])).tolist(),
            "sum": s.reduce(torch.tensor(rank + 1.0), reduce_op="sum").item(),
            "mean": s.reduce(torch.tensor(rank + 1.0)).item(),
            "max": s.reduce(torch.tensor(rank + 1.0), reduce_op="max").item(),
            "min": s.reduce(torch.tensor(rank + 1.0), reduce_op=dist.ReduceOp.MIN).item(),
            "non_tensor": s.reduce("text"),
            "broadcast": s.broadcast({"from": rank}, src=1),
            "all_true": s.reduce_boolean_decision(rank == 0, all=True),
            "any_true": s.reduce_boolean_decision(rank == 0, all=False),
            "grad": x.grad.tolist() if x.grad is not None else None,
            "sampler": s.distributed_sampler_kwargs,
            "no_sync_ranks_differ": not torch.equal(local[0], local[1]),
            "no_sync_is_local": torch.equal(local[1], 2 * local[0]),
            "synced_ranks_equal": torch.equal(synced[0], synced[1]),
            "synced_is_mean": torch.allclose(synced[0], 1.5 * local[0], rtol=1e-6, atol=0),
        }

    def facts(self) -> dict[str, Any]:
        return self._facts


class Compressed(Recorder):
    scenario = "compressed"


class Threads(Recorder):
    scenario = "threads"


class EvalOnly(PhalanxNet):
    """Rank 1 builds different weights; evaluation must still run rank 0's model on every rank."""

    def configure_model(self) -> None:
        if self.trainer.global_rank == 1:
            with torch.no_grad():
                for parameter in self.parameters():
                    parameter.add_(1.0)

    def on_validation_end(self) -> None:
        write_json(
            os.path.join(OUT, f"eval.rank{self.trainer.global_rank}.json"), {"state": state_to_lists(self.state_dict())}
        )


class Unpicklable(PhalanxNet):
    def __init__(self) -> None:
        super().__init__()
        self.transform = lambda t: t * 2


def fit(module: PhalanxNet, strategy: Any, **kwargs: Any) -> phalanx.Trainer:
    trainer = phalanx.Trainer(**trainer_kwargs(devices=2, strategy=strategy, max_epochs=1, **kwargs))
    trainer.fit(module, loader())
    return trainer


if __name__ == "__main__":
    torch.manual_seed(0)
    main: dict[str, Any] = {}
    fit(Unused(), "ddp_fork_find_unused_parameters_true")
    fit(
        Recorder(),
        DDPStrategy(
            start_method="fork",
            process_group_backend="gloo",
            timeout=timedelta(seconds=77),
            static_graph=True,
            gradient_as_bucket_view=True,
        ),
    )
    try:  # torch's SyncBatchNorm is GPU-only: refused with a clear message before any fork
        fit(WithBatchNorm(), "ddp_fork", sync_batchnorm=True)
    except Exception as err:
        main["syncbn"] = f"{type(err).__name__}: {err}"
    fit(
        Hooked(),
        DDPStrategy(start_method="fork", ddp_comm_hook=counting_hook, ddp_comm_state={"calls": 0}),
        accumulate_grad_batches=2,
    )
    registered = DDPStrategy(start_method="fork")
    registered.register_ddp_comm_hook(counting_hook, HOOK_STATE)
    fit(RegisteredHook(), registered)
    fit(Custom(), CustomDDPStrategy(start_method="fork"))
    fit(
        Compressed(),
        DDPStrategy(
            start_method="fork",
            ddp_comm_hook=default_hooks.allreduce_hook,
            ddp_comm_wrapper=default_hooks.fp16_compress_wrapper,
        ),
    )
    # No OMP_NUM_THREADS: the strategy shares the cores between the 2 local processes (as torchrun).
    omp, threads = os.environ.pop("OMP_NUM_THREADS", None), torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)  # what this process would have had without OMP_NUM_THREADS
    try:
        fit(Threads(), "ddp_fork")
    finally:
        if omp is not None:
            os.environ["OMP_NUM_THREADS"] = omp
        torch.set_num_threads(threads)
    main["cores"] = cores
    evaluated = EvalOnly()
    main["eval_state"] = state_to_lists(evaluated.state_dict())
    eval_trainer = phalanx.Trainer(**trainer_kwargs(devices=2, strategy="ddp_fork"))
    main["eval"] = eval_trainer.validate(evaluated, loader(), verbose=False)
    fit(Collectives(), "ddp_fork")
    try:
        fit(Unpicklable(), "ddp_spawn")
    except Exception as err:
        main["unpicklable"] = f"{type(err).__name__}: {err}"
    sys.ps1 = ">>> "  # what makes an interpreter interactive; the Trainer must pick ddp_notebook
    trainer = phalanx.Trainer(**trainer_kwargs(devices=2, strategy="auto"))
    main["auto_interactive"] = [type(trainer.strategy).__name__, trainer.strategy.start_method]
    del sys.ps1
    with open(os.path.join(OUT, "main.json"), "w") as fh:
        json.dump(main, fh)
