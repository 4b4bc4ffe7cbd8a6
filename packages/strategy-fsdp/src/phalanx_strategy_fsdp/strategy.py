"""FSDPStrategy: fully sharded data parallel training on PyTorch's FSDP2 (``fully_shard``).

Each rank keeps only its shard (1/N) of every parameter, gradient and optimizer state, as DTensors.
A sharding unit's full parameters are all-gathered just before its forward and backward and freed
right after; gradients are reduce-scattered so each rank receives the averaged gradient of its own
shard. Numerically this is data parallelism (the same update DDP makes), at about 1/N of the
per-rank memory for model state. Processes are started by the core's script launcher, as ``ddp``.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from phalanx.accelerators.accelerator import Accelerator
from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies.parallel import ParallelStrategy, split_parallel_arguments
from phalanx.strategies.sharded import ShardedParameters
from phalanx.utilities.activation_checkpointing import (
    ActivationCheckpointing,
    apply_activation_checkpointing,
    resolve_activation_checkpointing,
)
from phalanx_strategy_fsdp._fsdp2 import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from phalanx_strategy_fsdp._options import mesh_shape, validate_device_mesh, validate_options
from phalanx_strategy_fsdp._policy import class_names, compile_blocks, resolve_policy
from phalanx_strategy_fsdp._precision import check_offload_precision, mixed_precision_policy
from phalanx_strategy_fsdp._shard import shard_module
from phalanx_strategy_fsdp._strategy_checkpointing import FSDPCheckpointing

__all__ = ["FSDPStrategy"]


#: What the strategy passes to ``fully_shard`` itself: a user's ``FSDPStrategy(mesh=...)`` is refused
#: (device_mesh, mixed_precision and cpu_offload are the strategy's own options for those).
FULLY_SHARD_SUPPLIED = ("module", "mesh", "reshard_after_forward", "mp_policy", "offload_policy")


class FSDPStrategy(FSDPCheckpointing, ShardedParameters, ParallelStrategy):
    """Fully sharded data parallel training with ``torch.distributed.fsdp.fully_shard``.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        auto_wrap_policy: Submodules that become their own sharding unit: a set of module classes
            (e.g. ``{TransformerBlock}``) or a predicate ``module -> bool``. ``None`` shards only the
            root, so the whole model is all-gathered at once; name your blocks to bound peak memory.
        activation_checkpointing_policy: Submodules whose activations are recomputed in backward:
            the same forms as ``auto_wrap_policy`` (full recomputation per block, as in Lightning),
            or ``ActivationCheckpointing({Block}, mode="selective")`` to keep the matmul outputs and
            recompute the rest (:mod:`phalanx.utilities.activation_checkpointing`).
        compile_policy: Regional compile: blocks (same forms as ``auto_wrap_policy``) whose
            ``forward`` is compiled on its own after sharding, one graph serving every block of a
            class; FSDP2's per-block hooks stay eager. ``None`` compiles nothing per block
            (``trainer.fit(torch.compile(model))`` compiles the whole forward instead).
        compile_kwargs: Options for the per-block ``torch.compile`` (``backend``, ``mode``, ...).
        reshard_after_forward: ``True`` frees gathered parameters after forward (least memory);
            ``False`` keeps them until backward (one all-gather fewer per step); an int reshards
            to that many ranks.
        cpu_offload: Keep sharded parameters, gradients and optimizer state in CPU memory; the
            optimizer step then runs on CPU.
        mixed_precision: An explicit ``MixedPrecisionPolicy``; derived from the precision when None.
        device_mesh: ``None`` (shard over all ranks), ``"hybrid"`` (replicate across nodes, shard
            within each) or ``(replicate, shard)`` sizes for hybrid sharding (HSDP).
        state_dict_type: ``"sharded"``: every rank writes its shard into a checkpoint directory
            (fast, reshardable). ``"full"``: rank 0 writes one ordinary checkpoint file.
        **kwargs: Every :class:`~phalanx.strategies.parallel.ParallelStrategy` argument
            (``parallel_devices``, ``cluster_environment``, ``checkpoint_io`` (writes ``meta.pt`` and
            full files), ``precision_plugin`` (``*-mixed`` becomes FSDP's MixedPrecisionPolicy),
            ``process_group_backend`` (default gloo on CPU, ``"cpu:gloo,cuda:nccl"`` on CUDA: CPU
            collectives serve offloaded gradients and checkpoint planning), ``timeout``); the rest
            go to every ``fully_shard`` call (e.g. ``shard_placement_fn``). Only
            ``start_method="popen"``: sharded DTensor state cannot be sent back from spawned workers.
    """

    #: FSDP2's all-gathers and reduce-scatters run in the module's hooks: the Trainer may take the direct step.
    passes_step_through = True

    strategy_name: ClassVar[str] = "fsdp"
    supported_start_methods = ("popen",)

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        auto_wrap_policy: Any = None,
        activation_checkpointing_policy: Any = None,
        compile_policy: Any = None,
        compile_kwargs: dict[str, Any] | None = None,
        reshard_after_forward: bool | int = True,
        cpu_offload: bool = False,
        mixed_precision: MixedPrecisionPolicy | None = None,
        device_mesh: tuple[int, int] | str | None = None,
        state_dict_type: str = "sharded",
        **kwargs: Any,
    ) -> None:
        parallel, fully_shard_kwargs = split_parallel_arguments(
            kwargs, owner=type(self), forward_to=fully_shard, supplied=FULLY_SHARD_SUPPLIED
        )
        validate_options(
            state_dict_type=state_dict_type,
            reshard_after_forward=reshard_after_forward,
            cpu_offload=cpu_offload,
        )
        self.cpu_offload = cpu_offload  # before super(): the precision check below needs it
        super().__init__(accelerator, **parallel)
        self.auto_wrap_policy = resolve_policy(auto_wrap_policy, option="auto_wrap_policy")
        if not isinstance(activation_checkpointing_policy, (ActivationCheckpointing, str)):  # Lightning's forms,
            # torch's ModuleWrapPolicy included, mean full recomputation of those blocks
            activation_checkpointing_policy = resolve_policy(
                activation_checkpointing_policy, option="activation_checkpointing_policy"
            )
        self.activation_checkpointing_policy = resolve_activation_checkpointing(
            activation_checkpointing_policy, owner="FSDPStrategy"
        )
        self.compile_policy = resolve_policy(compile_policy, option="compile_policy")
        self.compile_kwargs = dict(compile_kwargs or {})
        self.reshard_after_forward = reshard_after_forward
        mixed_precision_policy(None, mixed_precision)  # type check now, derive at setup
        self._mixed_precision = mixed_precision
        self.device_mesh_spec = validate_device_mesh(device_mesh)
        self.state_dict_type = state_dict_type
        self._fully_shard_kwargs = fully_shard_kwargs
        self._device_mesh: DeviceMesh | None = None

    @property
    def fully_shard_kwargs(self) -> dict[str, Any]:
        """The options passed on to every ``fully_shard`` call (beside the strategy's own)."""
        return dict(self._fully_shard_kwargs)

    # ------------------------------------------------------------------ configuration
    def adapt_precision_plugin(self, precision_plugin: Precision) -> Precision:
        """Refuse a precision CPU offload cannot serve, as soon as the strategy is given one."""
        check_offload_precision(precision_plugin, cpu_offload=self.cpu_offload)
        return precision_plugin

    def default_process_group_backend(self) -> str:
        """gloo on CPU; ``cpu:gloo,cuda:nccl`` on CUDA (offloaded gradients need CPU collectives)."""
        return "cpu:gloo,cuda:nccl" if self.root_device.type == "cuda" else "gloo"

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The mesh parameters are sharded over; created in :meth:`setup_environment`."""
        return self._device_mesh

    @property
    def keep_process_group_after_teardown(self) -> bool:
        """While the Module is sharded its DTensors need the group: it lives until exit.

        The module stays sharded after a run (gathering it onto every rank could exceed memory):
        ``trainer.save_checkpoint`` after ``fit``, a following ``trainer.test(model)`` or a forward
        pass all communicate. The next run in this process reuses the group.
        """
        return isinstance(self.module, FSDPModule)

    # ------------------------------------------------------------------ setup
    def setup_environment(self) -> None:
        """Join the process group, select this process's device, then build the device mesh."""
        super().setup_environment()
        shape = mesh_shape(self.device_mesh_spec, world_size=self.world_size, num_nodes=self.num_nodes)
        names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
        self._device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)

    @contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        """Layers created in ``configure_model`` land on the meta device: no memory until sharded."""
        with torch.device("meta"):
            yield

    def model_to_device(self) -> None:
        """Nothing to move yet: ``fully_shard`` places each shard on its device in :meth:`wrap_model`."""

    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Shard the Module (also for evaluation: the full model may not fit on one rank).

        Optimizers are created after this, so they reference the sharded (DTensor) parameters and
        their state is sharded too. FSDP2 shards in place: the Module is its own wrapper.
        """
        del training
        module = self.require_module()
        check_offload_precision(self.precision_plugin, cpu_offload=self.cpu_offload)
        self._shard(module)
        return module

    def _shard(self, module: nn.Module) -> None:
        if isinstance(module, FSDPModule):  # sharded by an earlier run in this process
            if not dist.is_initialized():
                msg = (
                    f"{type(module).__name__} is already sharded by FSDP, but the process group of the run that "
                    "sharded it is gone. Fix: build a new model instance for this run (load its weights from a checkpoint)."
                )
                raise MisconfigurationError(msg)
            return
        assert self._device_mesh is not None, "setup_environment() must run before setup()"
        offload: OffloadPolicy = (
            CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if self.cpu_offload else OffloadPolicy()
        )
        kwargs = {
            "reshard_after_forward": self.reshard_after_forward,
            "mp_policy": mixed_precision_policy(self.precision_plugin, self._mixed_precision),
            "offload_policy": offload,
            **self._fully_shard_kwargs,
        }
        apply_activation_checkpointing(module, self.activation_checkpointing_policy, owner="FSDPStrategy")
        shard_module(
            module,
            mesh=self._device_mesh,
            wrap_policy=self.auto_wrap_policy,
            activation_checkpointing=None,  # applied above: full or selective, same names
            init_device=torch.device("cpu") if self.cpu_offload else self.root_device,
            fully_shard_kwargs=kwargs,
        )
        compile_blocks(module, self.compile_policy, self.compile_kwargs, strategy=self)

    # ------------------------------------------------------------------ steps
    @property
    def forward_wrapper(self) -> nn.Module | None:
        """The sharded Module itself: FSDP2's root hooks (unshard, input casts) live on it."""
        module = self.module
        return module if isinstance(module, FSDPModule) else None

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Accumulation steps keep unsharded gradients locally; the last micro-batch reduce-scatters all."""
        module = self.module
        if not isinstance(module, FSDPModule):
            yield
            return
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    def __repr__(self) -> str:
        ac = None if self.activation_checkpointing_policy is None else self.activation_checkpointing_policy.describe()
        return (
            f"FSDPStrategy(auto_wrap_policy={list(class_names(self.auto_wrap_policy))}, "
            f"activation_checkpointing_policy={ac!r}, compile_policy={list(class_names(self.compile_policy))}, "
            f"reshard_after_forward={self.reshard_after_forward!r}, cpu_offload={self.cpu_offload!r}, "
            f"device_mesh={self.device_mesh_spec!r}, state_dict_type={self.state_dict_type!r})"
        )
