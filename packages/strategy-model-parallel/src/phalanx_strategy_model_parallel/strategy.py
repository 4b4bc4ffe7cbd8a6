"""ModelParallelStrategy: data x tensor x pipeline parallel on one DeviceMesh.

The strategy owns the mesh and the lifecycle; the Module owns the parallelization. The mesh
(dims ``"data_parallel"``, ``"tensor_parallel"``, plus ``"pipeline_parallel"`` when used) exists
before ``Module.configure_model`` runs and is available there as ``self.device_mesh``, where the
Module applies tensor-parallel plans (``parallelize_module``) and ``fully_shard`` over the
data-parallel dimension, as in Lightning. Data is sharded over the data-parallel dimension only:
the ranks of one tensor- or pipeline-parallel group read the same batch. With
``pipeline_parallel_size > 1`` each rank keeps only its stages of the Module and
``run_pipeline`` runs a ``torch.distributed.pipelining`` schedule inside ``training_step``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from phalanx.accelerators.accelerator import Accelerator
from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies.configuration import StrategyConfiguration
from phalanx.strategies.parallel import ParallelStrategy, split_parallel_arguments
from phalanx_strategy_model_parallel._checks import check_configure_model, check_tensor_parallel_divisibility
from phalanx_strategy_model_parallel._layout import DATA_PARALLEL, MeshLayout, check_size, resolve_layout
from phalanx_strategy_model_parallel._materialize import has_meta_tensors, materialize
from phalanx_strategy_model_parallel._pipeline import SCHEDULES
from phalanx_strategy_model_parallel._pipeline_setup import PipelineSetup
from phalanx_strategy_model_parallel._strategy_checkpointing import ModelParallelCheckpointing

__all__ = ["ModelParallelStrategy"]

#: Precisions this strategy runs; "16-mixed" needs a GradScaler across shards and stages, which
#: neither DTensor tensor parallel nor pipelining schedules drive (use bf16).
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")


class ModelParallelStrategy(ModelParallelCheckpointing, ParallelStrategy):
    """N-D parallel training: data parallel x tensor parallel (x pipeline parallel) on one DeviceMesh.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        data_parallel_size: Ranks that hold different data (FSDP shards over them). ``"auto"``:
            the number of nodes when tensor_parallel_size is "auto" too (Lightning's meaning), else
            whatever the other sizes leave of the world.
        tensor_parallel_size: Ranks one layer is split over. ``"auto"``: the devices of one node
            (divided by pipeline_parallel_size) when both are "auto", else what is left.
        pipeline_parallel_size: Consecutive stages of the model on different ranks (1: none).
        pipeline_schedule: ``"1f1b"`` (default; least activation memory), ``"gpipe"``, or
            ``"interleaved_1f1b"`` (several stages per rank, a smaller bubble).
        num_microbatches: Microbatches each batch is split into under pipeline parallel; default
            twice the number of stages. The per-rank batch size must be a multiple.
        save_distributed_checkpoint: True (default): every rank writes its shards into a DCP
            directory (fast, reshardable). False: rank 0 writes one consolidated file.
        **kwargs: Every :class:`~phalanx.strategies.parallel.ParallelStrategy` argument
            (``parallel_devices``, ``cluster_environment``, ``checkpoint_io``, ``precision_plugin``,
            ``process_group_backend``, ``timeout``). Only ``start_method="popen"``: DTensor state
            cannot travel back from spawned workers.

    Raises:
        MisconfigurationError: An invalid size, schedule, microbatch count or unknown argument.
    """

    strategy_name: ClassVar[str] = "model_parallel"
    supported_start_methods = ("popen",)

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        data_parallel_size: int | str = "auto",
        tensor_parallel_size: int | str = "auto",
        pipeline_parallel_size: int = 1,
        pipeline_schedule: str = "1f1b",
        num_microbatches: int | None = None,
        save_distributed_checkpoint: bool = True,
        **kwargs: Any,
    ) -> None:
        parallel, rest = split_parallel_arguments(kwargs)
        if rest:
            msg = (
                f"ModelParallelStrategy got unknown argument(s) {sorted(rest)}. Valid: data_parallel_size, "
                "tensor_parallel_size, pipeline_parallel_size, pipeline_schedule, num_microbatches, "
                "save_distributed_checkpoint, and ParallelStrategy's parallel_devices, cluster_environment, "
                "checkpoint_io, precision_plugin, process_group_backend, timeout."
            )
            raise MisconfigurationError(msg)
        self._sizes = (
            check_size("data_parallel_size", data_parallel_size, allow_auto=True),
            check_size("tensor_parallel_size", tensor_parallel_size, allow_auto=True),
            int(check_size("pipeline_parallel_size", pipeline_parallel_size, allow_auto=False)),
        )
        if pipeline_schedule not in SCHEDULES:
            msg = f"ModelParallelStrategy(pipeline_schedule={pipeline_schedule!r}) is unknown; choose one of {sorted(SCHEDULES)}."
            raise MisconfigurationError(msg)
        if num_microbatches is not None:
            check_size("num_microbatches", num_microbatches, allow_auto=False)
        super().__init__(accelerator, **parallel)
        self.pipeline_schedule = pipeline_schedule
        self.num_microbatches = num_microbatches
        self.save_distributed_checkpoint = bool(save_distributed_checkpoint)
        self._layout: MeshLayout | None = None
        self._device_mesh: DeviceMesh | None = None
        self._pipeline: PipelineSetup | None = None
        self._trainer: Any = None

    # ------------------------------------------------------------------ configuration
    def adapt_precision_plugin(self, precision_plugin: Precision) -> Precision:
        """Refuse precisions the mesh cannot run, when the strategy is given one."""
        name = str(getattr(precision_plugin, "precision", "32-true"))
        if name not in PRECISIONS:
            msg = (
                f"ModelParallelStrategy does not run precision={name!r}: choose one of {list(PRECISIONS)}. "
                "16-mixed needs loss scaling across shards and pipeline stages; use 'bf16-mixed' instead."
            )
            raise MisconfigurationError(msg)
        return precision_plugin

    def configure(self, config: StrategyConfiguration) -> None:
        """Resolve the mesh sizes as soon as devices and nodes are known: a wrong product fails here."""
        super().configure(config)
        self._layout = resolve_layout(*self._sizes, num_nodes=self.num_nodes, num_processes=self.num_processes)

    @property
    def layout(self) -> MeshLayout:
        """The resolved sizes; known after the Trainer configured the strategy."""
        if self._layout is None:
            self._layout = resolve_layout(*self._sizes, num_nodes=self.num_nodes, num_processes=self.num_processes or 1)
        return self._layout

    @property
    def data_parallel_size(self) -> int:
        return self.layout.data_parallel

    @property
    def tensor_parallel_size(self) -> int:
        return self.layout.tensor_parallel

    @property
    def pipeline_parallel_size(self) -> int:
        return self.layout.pipeline_parallel

    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh, built in :meth:`setup_environment`; ``Module.configure_model`` sees it as ``self.device_mesh``."""
        if self._device_mesh is None:
            msg = "ModelParallelStrategy.device_mesh exists once the run started (setup_environment); use it in configure_model."
            raise RuntimeError(msg)
        return self._device_mesh

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """Shard data over the data-parallel dimension only; tp and pp peers read the same batch."""
        layout = self.layout
        return {"num_replicas": layout.data_parallel, "rank": layout.coordinates(self.global_rank)[DATA_PARALLEL]}

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """True: checkpoints are read into the sharded model, and checked against it here."""
        return True

    @property
    def keep_process_group_after_teardown(self) -> bool:
        """DTensor parameters and pipeline stages reference the mesh's groups: keep them until exit."""
        return self._device_mesh is not None

    @property
    def supports_inference_mode(self) -> bool:
        """False: FSDP2 reuses its all-gather buffers in training, and buffers made under
        ``torch.inference_mode`` cannot be updated later; evaluation uses ``torch.no_grad``."""
        return False

    @property
    def empty_init_on_meta(self) -> bool:
        """True: ``trainer.init_module(empty_init=True)`` builds on the meta device; setup allocates
        this rank's shards and runs each layer's ``reset_parameters``."""
        return True

    @property
    def offload_module_on_teardown(self) -> bool:
        """False: shards stay where they are (gathering them could exceed one rank's memory)."""
        return False

    # ------------------------------------------------------------------ setup
    def setup_environment(self) -> None:
        """Join the process group, select the device, build the mesh and hand it to the Module."""
        super().setup_environment()
        layout = self.layout
        if self._device_mesh is None:
            self._device_mesh = init_device_mesh(self.root_device.type, layout.shape, mesh_dim_names=layout.dim_names)
        module = self._module
        if module is not None and not isinstance(getattr(type(module), "device_mesh", None), property):
            module.device_mesh = self._device_mesh  # plain attribute: a DeviceMesh is no Module/Parameter

    def setup(self, trainer: Any) -> None:
        """Remember the Trainer (accumulation and clipping settings), then the base template."""
        self._trainer = trainer
        super().setup(trainer)

    def model_to_device(self) -> None:
        """Nothing to move yet: :meth:`wrap_model` splits stages first, then materialises."""

    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Check the Module against the mesh, keep this rank's pipeline stages, allocate meta tensors.

        The Module parallelized itself in ``configure_model``; it is its own wrapper. Optimizers
        are built after this, so they see only this rank's (sharded) parameters.
        """
        module = self.require_module()
        layout = self.layout
        parallelized = check_configure_model(module, tensor_parallel_size=layout.tensor_parallel)
        if layout.pipeline_parallel > 1 and self._pipeline is None:
            self._check_pipeline_trainer_settings(training)
            self._pipeline = PipelineSetup.split(self, module)
        if has_meta_tensors(module):
            materialize(module, self.root_device)
        else:
            for tensor in (*module.parameters(), *module.buffers()):
                if not isinstance(tensor, DTensor) and tensor.device != self.root_device:
                    module.to(self.root_device)
                    break
        check_tensor_parallel_divisibility(module, layout.tensor_parallel)
        if not parallelized and self._pipeline is None and not isinstance(module, FSDPModule):
            fully_shard(module, mesh=self.device_mesh[DATA_PARALLEL])  # pure data parallel: shard like FSDP
        if self._pipeline is not None:
            self._pipeline.build(training=training)
        return module

    def _check_pipeline_trainer_settings(self, training: bool) -> None:
        trainer = self._trainer
        if training and trainer is not None and getattr(trainer, "gradient_clip_val", None):
            msg = (
                f"Trainer(gradient_clip_val={trainer.gradient_clip_val}) with pipeline_parallel_size="
                f"{self.layout.pipeline_parallel}: the core clips the norm of this rank's stage only, not of the whole "
                "model. Fix: remove gradient_clip_val, or clip in on_before_optimizer_step with a norm all-reduced "
                "over device_mesh['pipeline_parallel']."
            )
            raise MisconfigurationError(msg)

    # ------------------------------------------------------------------ steps
    @property
    def forward_wrapper(self) -> nn.Module | None:
        """The Module itself when ``fully_shard`` was applied to its root (FSDP2's root hooks live on it)."""
        module = self._module
        return module if isinstance(module, FSDPModule) else None

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The Module's step; under pipeline parallel it must call :meth:`run_pipeline` once."""
        if self._pipeline is None:
            return super().training_step(*args, **kwargs)
        batch_idx = args[1] if len(args) > 1 else kwargs.get("batch_idx", 0)
        self._pipeline.begin_step(int(batch_idx), self._trainer)
        output = super().training_step(*args, **kwargs)
        self._pipeline.end_step(output)
        return output

    @property
    def training_step_runs_backward(self) -> bool:
        """Under pipeline parallel the schedule runs backward inside ``training_step``."""
        return self._pipeline is not None

    def run_pipeline(
        self,
        *inputs: Any,
        target: Any = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    ) -> Any:
        """Run the batch through the pipeline stages (forward and, when training, backward).

        Args:
            *inputs: The first stage's inputs for the whole (per-rank) batch.
            target: What ``loss_fn`` compares the last stage's output with, for the whole batch.
            loss_fn: ``loss_fn(output, target)`` for one microbatch; mean-reduce it, so that the
                mean over microbatches is the batch's loss. Without it the outputs are returned.

        Returns:
            The mean microbatch loss (detached; gradients are already accumulated) on every pipeline
            rank, or the last stage's outputs for the whole batch on every pipeline rank.
        """
        if self._pipeline is None:
            msg = "run_pipeline needs pipeline_parallel_size > 1; with 1, call the model directly in training_step."
            raise MisconfigurationError(msg)
        return self._pipeline.run(inputs, target=target, loss_fn=loss_fn)

    def teardown(self) -> None:
        """Forget the schedule (its stages hold this run's shapes); the mesh stays for the next run."""
        if self._pipeline is not None:
            self._pipeline.runner = None
        super().teardown()

    def __repr__(self) -> str:
        dp, tp, pp = self._sizes
        return (
            f"ModelParallelStrategy(data_parallel_size={dp!r}, tensor_parallel_size={tp!r}, "
            f"pipeline_parallel_size={pp}, pipeline_schedule={self.pipeline_schedule!r}, "
            f"save_distributed_checkpoint={self.save_distributed_checkpoint})"
        )

