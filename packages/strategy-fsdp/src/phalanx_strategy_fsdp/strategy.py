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
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.errors import MisconfigurationError
from phalanx.launchers.launcher import Launcher
from phalanx.launchers.subprocess_script import SubprocessScriptLauncher
from phalanx.precision.precision import Precision
from phalanx.strategies._redirect import call_through_wrapper
from phalanx.strategies.parallel import ParallelStrategy
from phalanx_strategy_fsdp._fsdp2 import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy
from phalanx_strategy_fsdp._options import mesh_shape, validate_device_mesh, validate_options
from phalanx_strategy_fsdp._policy import class_names, resolve_policy
from phalanx_strategy_fsdp._precision import check_offload_precision, mixed_precision_policy
from phalanx_strategy_fsdp._process_group import destroy_process_group_at_exit
from phalanx_strategy_fsdp._shard import shard_module
from phalanx_strategy_fsdp._strategy_checkpointing import FSDPCheckpointing

__all__ = ["FSDPStrategy"]


class FSDPStrategy(FSDPCheckpointing, ParallelStrategy):
    """Fully sharded data parallel training with ``torch.distributed.fsdp.fully_shard``.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        parallel_devices: One device per local process (filled by the Trainer from ``devices``).
        cluster_environment: Ranks and rendezvous; detected (torchrun, SLURM, else local) when None.
        checkpoint_io: Writes ``meta.pt`` and full checkpoint files.
        precision_plugin: The Trainer's precision; ``*-mixed`` becomes FSDP's MixedPrecisionPolicy.
        auto_wrap_policy: Submodules that become their own sharding unit: a set of module classes
            (e.g. ``{TransformerBlock}``) or a predicate ``module -> bool``. ``None`` shards only the
            root, so the whole model is all-gathered at once; name your blocks to bound peak memory.
        activation_checkpointing_policy: Submodules whose activations are recomputed in backward
            (same forms as ``auto_wrap_policy``).
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
        process_group_backend: Default gloo on CPU, ``"cpu:gloo,cuda:nccl"`` on CUDA (CPU
            collectives are needed for offloaded gradients and checkpoint planning).
        timeout: How long a collective may wait for the other ranks.
        **fully_shard_kwargs: Passed to every ``fully_shard`` call (e.g. ``shard_placement_fn``).
    """

    strategy_name: ClassVar[str] = "fsdp"
    _created_process_group: bool  # set by ParallelStrategy

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        auto_wrap_policy: Any = None,
        activation_checkpointing_policy: Any = None,
        reshard_after_forward: bool | int = True,
        cpu_offload: bool = False,
        mixed_precision: MixedPrecisionPolicy | None = None,
        device_mesh: tuple[int, int] | str | None = None,
        state_dict_type: str = "sharded",
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
        **fully_shard_kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        validate_options(
            state_dict_type=state_dict_type,
            reshard_after_forward=reshard_after_forward,
            cpu_offload=cpu_offload,
            timeout=timeout,
        )
        self.auto_wrap_policy = resolve_policy(auto_wrap_policy, option="auto_wrap_policy")
        self.activation_checkpointing_policy = resolve_policy(
            activation_checkpointing_policy, option="activation_checkpointing_policy"
        )
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload
        mixed_precision_policy(None, mixed_precision)  # type check now, derive at setup
        self._mixed_precision = mixed_precision
        self.device_mesh_spec = validate_device_mesh(device_mesh)
        self.state_dict_type = state_dict_type
        self._process_group_backend = process_group_backend
        self._timeout = timeout
        self._fully_shard_kwargs = fully_shard_kwargs
        self._device_mesh: DeviceMesh | None = None
        self._restored_sharded = False
        self._pending_restore: str | dict[str, Any] | None = None
        self._restored_meta: dict[str, Any] | None = None
        check_offload_precision(precision_plugin, cpu_offload=cpu_offload)

    # ------------------------------------------------------------------ configuration
    @property
    def precision_plugin(self) -> Precision:
        """The precision; checked against ``cpu_offload`` as soon as the Trainer assigns it."""
        return super().precision_plugin

    @precision_plugin.setter
    def precision_plugin(self, precision_plugin: Precision | None) -> None:
        check_offload_precision(precision_plugin, cpu_offload=getattr(self, "cpu_offload", False))
        self._precision_plugin = precision_plugin

    @property
    def process_group_backend(self) -> str:
        """The backend in use or about to be: the one given, else gloo (CPU) or cpu:gloo,cuda:nccl."""
        if self._process_group_backend:
            return self._process_group_backend
        return "cpu:gloo,cuda:nccl" if self.root_device.type == "cuda" else "gloo"

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The mesh parameters are sharded over; created in :meth:`setup_environment`."""
        return self._device_mesh

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """True: a sharded checkpoint is loaded into the already sharded model and optimizers."""
        return True

    @property
    def launcher(self) -> Launcher:
        """Re-runs the script per local rank (or only runs the stage under torchrun / srun)."""
        if self._launcher is None:
            self._configure_launcher()
        return self._launcher  # type: ignore[no-any-return]

    def _configure_launcher(self) -> None:
        self._launcher = SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def _on_configuration_change(self) -> None:
        self._launcher = None

    # ------------------------------------------------------------------ setup
    def setup_environment(self) -> None:
        """Join the process group, select this process's device, then build the device mesh."""
        self.set_world_ranks()
        self._set_num_threads_if_needed(self.num_processes)
        self._init_process_group(self.process_group_backend, self._timeout)
        super().setup_environment()
        shape = mesh_shape(self.device_mesh_spec, world_size=self.world_size, num_nodes=self.num_nodes)
        names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
        self._device_mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)

    @contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        """Layers created in ``configure_model`` land on the meta device: no memory until sharded."""
        with torch.device("meta"):
            yield

    def setup(self, trainer: Any) -> None:
        """Shard the model, then build optimizers over the sharded (DTensor) parameters.

        Optimizers must be created after ``fully_shard``: they have to reference the sharded
        parameters, so their state is sharded too. Evaluation-only runs are sharded as well, since
        the full model may not fit on one rank.
        """
        self._require_accelerator().setup(trainer)
        module = self._require_module()
        check_offload_precision(self.precision_plugin, cpu_offload=self.cpu_offload)
        self.model = self.precision_plugin.convert_module(module)
        self._shard(module)
        self.model = module
        if bool(getattr(trainer, "training", True)):
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        self._apply_pending_restore()

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
        shard_module(
            module,
            mesh=self._device_mesh,
            wrap_policy=self.auto_wrap_policy,
            activation_checkpointing=self.activation_checkpointing_policy,
            init_device=torch.device("cpu") if self.cpu_offload else self.root_device,
            fully_shard_kwargs=kwargs,
        )

    def model_to_device(self) -> None:
        """Move an unsharded model to the device; ``fully_shard`` places sharded parameters itself."""
        module = self._require_module()
        if not isinstance(module, FSDPModule):
            module.to(self.root_device)

    # ------------------------------------------------------------------ steps
    def _call_step(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run a step method through ``module.__call__`` so FSDP's root hooks (unshard, casts) run."""
        module = self._require_module()
        if not isinstance(module, FSDPModule):
            return getattr(module, name)(*args, **kwargs)
        # FSDP2 hooks live on the module itself: it is its own wrapper.
        return call_through_wrapper(module, module, name, *args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.train_step_context():
            return self._call_step("training_step", *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.val_step_context():
            return self._call_step("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.test_step_context():
            return self._call_step("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.predict_step_context():
            return self._call_step("predict_step", *args, **kwargs)

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Accumulation steps keep unsharded gradients locally; the last micro-batch reduce-scatters all."""
        module = self._module
        if not isinstance(module, FSDPModule):
            yield
            return
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> None:
        """Release the parts but keep the process group while the module is sharded.

        The module stays sharded after a run (gathering it onto every rank could exceed memory),
        and its DTensors need the process group: ``trainer.save_checkpoint`` after ``fit``, a
        following ``trainer.test(model)`` or a forward pass all communicate. The group is destroyed
        at interpreter exit instead, or reused by the next run in this process.
        """
        self._restored_sharded = False
        self._pending_restore = None
        self._restored_meta = None
        if self._created_process_group and isinstance(self._module, FSDPModule):
            self._created_process_group = False
            destroy_process_group_at_exit()
        super().teardown()

    def __repr__(self) -> str:
        return (
            f"FSDPStrategy(auto_wrap_policy={list(class_names(self.auto_wrap_policy))}, "
            f"reshard_after_forward={self.reshard_after_forward!r}, cpu_offload={self.cpu_offload!r}, "
            f"device_mesh={self.device_mesh_spec!r}, state_dict_type={self.state_dict_type!r})"
        )
