"""xla and xla_debug: one process per XLA device, data parallel, the torch-xla way.

Each replica holds the whole model; after backward the gradients are averaged across replicas
with ``xm.reduce_gradients`` (an XLA all-reduce compiled into the step's graph), the optimizer
steps and ``torch_xla.sync()`` cuts the graph. Data arrives through ``MpDeviceLoader`` over a
DistributedSampler. Collectives use torch-xla's ``xm`` operations, not ``torch.distributed``.

Several devices need real multi-device hardware (TPU, or another PJRT device): on XLA:CPU
torch-xla runs them as threads whose collectives do not work (pytorch/xla issue 5005), so that
combination is refused with the alternatives instead of hanging.
"""

from __future__ import annotations

import io
import os
from typing import Any, ClassVar

import torch
from torch.optim import Optimizer

from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies.parallel import ParallelStrategy
from phalanx.strategies.strategy import TBroadcast
from phalanx_strategy_xla import _runtime
from phalanx_strategy_xla._strategy_base import XLAStrategyMixin, check_accelerator
from phalanx_strategy_xla.environment import XLAEnvironment
from phalanx_strategy_xla.launcher import XLALauncher

__all__ = ["XLAStrategy"]

_DEBUG_ENV = {"PT_XLA_DEBUG": "1", "PT_XLA_DEBUG_LEVEL": "1"}
_REDUCE_OPS = ("sum", "mean", "avg", "max", "min")


class XLAStrategy(XLAStrategyMixin, ParallelStrategy):
    """Data parallel training with one process per XLA device, launched by torch-xla.

    Args:
        accelerator: The XLA accelerator; any other raises.
        parallel_devices: One ``xla`` device per process (filled from ``devices`` by the Trainer).
        checkpoint_io: Defaults to XLA checkpoint IO (master ordinal writes one file).
        precision_plugin: "32-true" or XLA's bf16 precisions; fp16/fp64 raise.
        debug: ``xla_debug``: set torch-xla's debug variables for the workers and print its
            metrics report (compilations, transfers, CPU fallbacks) after every stage.
        start_method: How torch-xla starts workers: "fork" (default) or "spawn".
    """

    strategy_name: ClassVar[str] = "xla"
    supported_start_methods = ("fork", "spawn")

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        debug: bool = False,
        start_method: str = "fork",
    ) -> None:
        check_accelerator("xla_debug" if debug else "xla", accelerator)
        super().__init__(
            accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=XLAEnvironment(),
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            start_method=start_method,
        )
        self.debug = debug
        self._launched = False
        self._saved_env: dict[str, str | None] = {}

    @property
    def _name(self) -> str:
        """``xla_debug`` when debugging, so messages name what the user asked for."""
        return "xla_debug" if self.debug else "xla"

    # ------------------------------------------------------------------ launching
    def create_launcher(self) -> XLALauncher:
        """Check the device count torch-xla can launch, then create its launcher."""
        self._check_device_count()
        return XLALauncher(self, start_method=self.start_method)

    def _check_device_count(self) -> None:
        requested = self.num_processes * self.num_nodes
        if requested <= 1:
            return
        visible = _runtime.visible_device_count()
        kind = _runtime.device_type()
        if kind == "CPU":
            msg = (
                f"strategy={self._name!r} with {requested} XLA:CPU devices is not supported: torch-xla runs "
                "them as threads whose collectives fail on CPU (pytorch/xla issue 5005). Valid here: devices=1. "
                "Fix: devices=1, strategy='xla_fsdp' (SPMD, works on XLA:CPU with CPU_NUM_DEVICES=n), or run on TPU."
            )
            raise MisconfigurationError(msg)
        if self.num_processes != visible:
            msg = (
                f"strategy={self._name!r} got devices={self.num_processes}, but torch-xla's launcher starts "
                f"either 1 process or one per device ({visible} on this host). Fix: devices=1 or devices={visible} "
                "(or 'auto'); to use fewer, limit what the runtime sees (e.g. TPU_VISIBLE_CHIPS)."
            )
            raise MisconfigurationError(msg)

    def set_world_ranks(self) -> None:
        """Plan the world size for the parent process; inside workers the runtime decides."""
        self.cluster_environment.set_world_size(self.num_nodes * max(1, self.num_processes))

    @property
    def root_device(self) -> torch.device:
        """This replica's XLA device (only known inside a launched worker).

        Raises:
            RuntimeError: Asked for in the parent process before the workers were launched.
        """
        if not self._launched:
            msg = (
                f"strategy={self._name!r} has no device before torch-xla launched its workers; "
                "read root_device inside fit/validate/test/predict (e.g. in a hook), not before."
            )
            raise RuntimeError(msg)
        import torch_xla

        return torch_xla.device()

    @property
    def is_distributed(self) -> bool:
        """Whether replicas must talk to each other (more than one of them)."""
        return self._launched and self.world_size > 1

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """Each replica reads its own shard of every epoch."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup_environment(self) -> None:
        """Inside a worker: mark launched (ranks now come from PJRT), set debug variables, check the device."""
        self._launched = True
        env = self.cluster_environment
        if isinstance(env, XLAEnvironment):
            env.launched = True
        if self.debug:
            self._saved_env = {key: os.environ.get(key) for key in _DEBUG_ENV}
            os.environ.update(_DEBUG_ENV)
        super().setup_environment()

    def model_to_device(self) -> None:
        """Move the Module to this replica's device; replicas then start from replica 0's weights."""
        module = self.require_module()
        module.to(self.root_device)
        if self.is_distributed:
            import torch_xla.core.xla_model as xm

            xm.broadcast_master_param(module)

    def _reduce_gradients(self, optimizer: Optimizer) -> None:
        """Average gradients over replicas with torch-xla's all-reduce (no-op with one replica)."""
        if self.is_distributed:
            import torch_xla.core.xla_model as xm

            xm.reduce_gradients(optimizer)

    def block_backward_sync(self) -> Any:
        """Accumulation needs nothing: gradients are only reduced in ``optimizer_step``."""
        from contextlib import nullcontext

        return nullcontext()

    # ------------------------------------------------------------------ collectives
    def all_gather(self, tensor: torch.Tensor, group: Any | None = None, sync_grads: bool = False) -> torch.Tensor:
        """Stack ``tensor`` from every replica along a new first dimension (``xm.all_gather``)."""
        if not self.is_distributed:
            return tensor
        import torch_xla.core.functions as xf
        import torch_xla.core.xla_model as xm

        expanded = tensor.unsqueeze(0)
        return xf.all_gather(expanded) if sync_grads else xm.all_gather(expanded)

    def reduce(self, tensor: torch.Tensor | Any, group: Any | None = None, reduce_op: Any | None = "mean") -> torch.Tensor | Any:
        """Reduce over replicas with ``xm.all_reduce``: "mean"/"avg" (default), "sum", "max" or "min".

        Raises:
            MisconfigurationError: Another reduce_op.
        """
        op = str(getattr(reduce_op, "name", reduce_op) or "mean").lower()
        if op not in _REDUCE_OPS:
            msg = f"strategy={self._name!r} got reduce_op={reduce_op!r}; valid: {list(_REDUCE_OPS)}. Pass e.g. 'mean'."
            raise MisconfigurationError(msg)
        if not isinstance(tensor, torch.Tensor) or not self.is_distributed:
            return tensor
        import torch_xla.core.xla_model as xm

        kind = {"sum": xm.REDUCE_SUM, "mean": xm.REDUCE_SUM, "avg": xm.REDUCE_SUM, "max": xm.REDUCE_MAX, "min": xm.REDUCE_MIN}
        value = tensor.detach().to(self.root_device)
        if op in ("mean", "avg") and not torch.is_floating_point(value):
            value = value.float()
        result = xm.all_reduce(kind[op], value)
        return result / self.world_size if op in ("mean", "avg") else result

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Send any torch-saveable object from replica ``src`` to all (two ``collective_broadcast``s)."""
        if not self.is_distributed:
            return obj
        import torch_xla.core.xla_model as xm

        payload = b""
        if self.global_rank == src:
            buffer = io.BytesIO()
            torch.save(obj, buffer)
            payload = buffer.getvalue()
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.root_device)
        xm.collective_broadcast([size], root_ordinal=src)
        length = int(size.cpu().item())
        data = torch.zeros(length, dtype=torch.uint8)
        if payload:
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        device_data = data.to(self.root_device)
        xm.collective_broadcast([device_data], root_ordinal=src)
        received = io.BytesIO(device_data.cpu().numpy().tobytes())
        return torch.load(received, weights_only=False)  # type: ignore[no-any-return]

    def barrier(self, name: str | None = None) -> None:
        """Wait for every replica (``xm.rendezvous``)."""
        if self.is_distributed:
            import torch_xla.core.xla_model as xm

            xm.rendezvous(name or "phalanx_barrier")

    # ------------------------------------------------------------------ debug
    def _report(self, stage: str) -> None:
        if not self.debug:
            return
        import torch_xla.debug.metrics as met

        if self.is_global_zero:
            fallbacks = met.executed_fallback_ops()
            print(f"[phalanx xla_debug] torch-xla metrics after {stage}:\n{met.short_metrics_report()}", flush=True)
            if fallbacks:
                print(f"[phalanx xla_debug] ops that fell back to CPU (slow): {sorted(fallbacks)}", flush=True)

    def on_train_end(self) -> None:
        """xla_debug: report compilations, executions and CPU fallbacks of the training run."""
        self._report("training")

    def on_validation_end(self) -> None:
        """xla_debug: report metrics after validation."""
        self._report("validation")

    def on_test_end(self) -> None:
        """xla_debug: report metrics after testing."""
        self._report("testing")

    def on_predict_end(self) -> None:
        """xla_debug: report metrics after prediction."""
        self._report("prediction")

    def teardown(self) -> None:
        """Restore debug variables, forget the launch, then the usual teardown (Module back on CPU)."""
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}
        super().teardown()
        self._launched = False

    def __repr__(self) -> str:
        return f"XLAStrategy(debug={self.debug}, devices={self.num_processes}, precision_plugin={self.precision_plugin!r})"
