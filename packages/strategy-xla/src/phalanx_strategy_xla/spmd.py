"""xla_fsdp: SPMD in one process over every device, FSDP-style, as torch-xla recommends today.

One Python process drives all devices of the host through a device mesh. Every input tensor is
sharded along the mesh's data axis (each device holds a slice of the batch) and every parameter is
sharded along its largest dimension by torch-xla's ``SpmdFullyShardedDataParallel`` ("FSDPv2").
The XLA compiler then inserts the all-gathers and reduce-scatters itself; the program stays the
single-device program, which is why its losses equal a plain single-device run.

SPMD mode is switched on per process (``xr.use_spmd()``) and cannot be switched off: run SPMD jobs
in their own process. On XLA:CPU, ``CPU_NUM_DEVICES=n`` (set before the first XLA call) gives n
devices, which is how this strategy is tested without a TPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies.parallel import ParallelStrategy
from phalanx.utilities import apply_to_collection
from phalanx_strategy_xla import _runtime
from phalanx_strategy_xla._strategy_base import XLAStrategyMixin, check_accelerator, wrap_dataloader

__all__ = ["XLAFSDPStrategy"]

_STATE_DICT_TYPES = ("full", "sharded")


class XLAFSDPStrategy(XLAStrategyMixin, ParallelStrategy):
    """SPMD data parallel with FSDP-style parameter sharding over a device mesh (torch-xla FSDPv2).

    Args:
        accelerator: The XLA accelerator; any other raises.
        parallel_devices: Must cover every device the runtime exposes (an XLA mesh spans them all).
        checkpoint_io: Defaults to XLA checkpoint IO, sharded when ``state_dict_type="sharded"``.
        precision_plugin: "32-true" or XLA's bf16 precisions; fp16/fp64 raise.
        mesh_shape: Shape of the device mesh; default ``(num_devices,)``. Its product must be the
            device count.
        axis_names: One name per mesh dimension; must contain ``"fsdp"`` (parameters shard there).
        data_axis: Mesh axis the batch dimension of inputs is sharded along.
        auto_wrap_policy: Passed to FSDPv2 to wrap submodules separately (e.g. transformer blocks).
        state_dict_type: "full" (one file, gathered on the host) or "sharded" (a DCP folder).
    """

    strategy_name: ClassVar[str] = "xla_fsdp"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        mesh_shape: tuple[int, ...] | None = None,
        axis_names: tuple[str, ...] = ("fsdp",),
        data_axis: str = "fsdp",
        auto_wrap_policy: Callable[..., Any] | None = None,
        state_dict_type: str = "full",
    ) -> None:
        check_accelerator(self.strategy_name, accelerator)
        if "fsdp" not in axis_names or data_axis not in axis_names:
            msg = (
                f"xla_fsdp got axis_names={axis_names!r} and data_axis={data_axis!r}; the mesh needs an 'fsdp' axis "
                "(parameters shard along it) and data_axis must be one of axis_names. Fix: axis_names=('fsdp',)."
            )
            raise MisconfigurationError(msg)
        if mesh_shape is not None and len(mesh_shape) != len(axis_names):
            msg = f"xla_fsdp got mesh_shape={mesh_shape!r} for axis_names={axis_names!r}; give one size per axis name."
            raise MisconfigurationError(msg)
        if state_dict_type not in _STATE_DICT_TYPES:
            msg = f"xla_fsdp got state_dict_type={state_dict_type!r}; valid: {list(_STATE_DICT_TYPES)}."
            raise MisconfigurationError(msg)
        super().__init__(
            accelerator,
            parallel_devices=parallel_devices,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self.mesh_shape = mesh_shape
        self.axis_names = tuple(axis_names)
        self.data_axis = data_axis
        self.auto_wrap_policy = auto_wrap_policy
        self.state_dict_type = state_dict_type
        self.mesh: Any = None

    # ------------------------------------------------------------------ one process
    @property
    def global_rank(self) -> int:
        """0: SPMD runs one process for all devices."""
        return 0

    @property
    def local_rank(self) -> int:
        """0: SPMD runs one process for all devices."""
        return 0

    @property
    def node_rank(self) -> int:
        """0: multi-host SPMD is not supported by this strategy yet."""
        return 0

    @property
    def world_size(self) -> int:
        """1 process: the batch is split across devices by sharding, not by a DistributedSampler."""
        return 1

    def set_world_ranks(self) -> None:
        """Nothing to assign: there is one process."""

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """One replica: every step reads the global batch, which sharding then splits."""
        return {"num_replicas": 1, "rank": 0}

    def default_checkpoint_io(self) -> CheckpointIO:
        """XLA checkpoint IO, sharded (a DCP folder) when ``state_dict_type="sharded"``."""
        from phalanx_strategy_xla.checkpoint_io import XLACheckpointIO

        return XLACheckpointIO(sharded=self.state_dict_type == "sharded")

    def create_launcher(self) -> None:  # type: ignore[override]
        """No launcher (one process); check the devices cover the whole runtime, as a mesh must."""
        requested = self.num_processes * self.num_nodes
        if self.num_nodes != 1:
            msg = f"xla_fsdp got num_nodes={self.num_nodes}; multi-host SPMD is not supported yet. Fix: num_nodes=1."
            raise MisconfigurationError(msg)
        visible = _runtime.visible_device_count()
        if requested not in (0, visible):
            msg = (
                f"xla_fsdp got devices={requested}, but an XLA SPMD mesh must span every device the runtime exposes "
                f"({visible} here). Fix: devices={visible} or devices='auto'"
                + ("; on XLA:CPU set CPU_NUM_DEVICES to change the count." if _runtime.device_type() == "CPU" else ".")
            )
            raise MisconfigurationError(msg)

    @property
    def root_device(self) -> torch.device:
        """The SPMD virtual device (``xla:0``) standing for the whole mesh."""
        torch_xla = _runtime.import_torch_xla("strategy='xla_fsdp'")
        return torch_xla.device()  # type: ignore[no-any-return]

    def setup_environment(self) -> None:
        """Switch this process to SPMD and build the mesh, before any parameter reaches a device."""
        import numpy as np
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        if not xr.is_spmd():
            xr.use_spmd()
        count = int(xr.global_runtime_device_count())
        shape = self.mesh_shape or (count,) + (1,) * (len(self.axis_names) - 1)
        if int(np.prod(shape)) != count:
            msg = f"xla_fsdp mesh_shape={shape!r} holds {int(np.prod(shape))} devices but the runtime has {count}; make the product {count}."
            raise MisconfigurationError(msg)
        self.mesh = xs.Mesh(np.arange(count), tuple(shape), self.axis_names)
        xs.set_global_mesh(self.mesh)
        super().setup_environment()

    def model_to_device(self) -> None:
        """Move the Module to the SPMD device (one process holds the whole mesh)."""
        self.require_module().to(self.root_device)

    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Wrap the Module in FSDPv2, which shards the parameters over the mesh (also for evaluation)."""
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        del training
        module = self.require_module()
        try:
            return SpmdFullyShardedDataParallel(
                module, mesh=self.mesh, shard_output=_keep_output_sharding, auto_wrap_policy=self.auto_wrap_policy
            )
        except RuntimeError as err:
            msg = f"xla_fsdp could not wrap {type(module).__name__}: {err} Fix: define forward() on the Module."
            raise MisconfigurationError(msg) from err

    # ------------------------------------------------------------------ data
    def process_dataloader(self, dataloader: Any) -> Any:
        """``MpDeviceLoader`` that uploads every tensor already sharded along the data axis."""
        return wrap_dataloader(dataloader, self.root_device, input_sharding=_batch_sharding(self.mesh, self.data_axis))

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Move the batch (if the loader did not) and shard any unsharded tensor along the data axis."""
        batch = super().batch_to_device(batch, device, dataloader_idx)
        if self.mesh is None:
            return batch
        import torch_xla
        import torch_xla.distributed.spmd as xs

        def shard(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.device.type == "xla" and tensor.dim() >= 1 and not torch_xla._XLAC._get_xla_sharding_spec(tensor):
                xs.mark_sharding(tensor, self.mesh, (self.data_axis,) + (None,) * (tensor.dim() - 1))
            return tensor

        return apply_to_collection(batch, torch.Tensor, shard)

    def block_backward_sync(self) -> Any:
        """Nothing to block: the compiler places gradient collectives inside the step."""
        from contextlib import nullcontext

        return nullcontext()

    def __repr__(self) -> str:
        return f"XLAFSDPStrategy(mesh_shape={self.mesh_shape}, axis_names={self.axis_names}, state_dict_type={self.state_dict_type!r})"


def _keep_output_sharding(output: Any, mesh: Any) -> None:
    """Leave step outputs (a loss, logged values) as the compiler propagates them.

    FSDPv2's default marks the first output tensor's batch dimension as sharded, which fails for a
    scalar loss or a dict; the losses phalanx steps return need no explicit sharding.
    """
    del output, mesh


def _batch_sharding(mesh: Any, axis: str) -> Any:
    """A ``ShardingSpec`` that shards dimension 0 of a tensor of any rank along ``axis``.

    ``MpDeviceLoader`` applies one spec to every tensor of a batch, and a plain spec only fits one
    rank (images and labels differ); this one builds the matching spec per rank. Scalars replicate.
    """
    import torch_xla.distributed.spmd as xs

    class LeadingDimSharding(xs.ShardingSpec):  # type: ignore[misc]
        def __post_init__(self) -> None:
            self._by_rank: dict[int, Any] = {}

        def can_apply(self, t: torch.Tensor) -> bool:
            return t.dim() >= 1

        def xla_spec(self, t: torch.Tensor) -> Any:
            if not self.can_apply(t):
                return None
            spec = self._by_rank.get(t.dim())
            if spec is None:
                spec = self._by_rank[t.dim()] = xs.ShardingSpec(self.mesh, (axis,) + (None,) * (t.dim() - 1))
            return spec.xla_spec(t)

    return LeadingDimSharding(mesh, (axis,))
