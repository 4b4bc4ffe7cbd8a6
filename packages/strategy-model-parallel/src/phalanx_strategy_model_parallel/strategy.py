"""ModelParallelStrategy: data (hybrid) x context x tensor x pipeline parallel on one DeviceMesh.

The strategy owns the mesh and the lifecycle; the Module owns the parallelization. The mesh
(dims ``"data_parallel"`` or ``"data_parallel_replicate"`` x ``"data_parallel_shard"``,
``"tensor_parallel"``, plus ``"context_parallel"`` and ``"pipeline_parallel"`` when used) exists
before ``Module.configure_model`` runs and is available there as ``self.device_mesh``, where the
Module applies tensor-parallel plans (``parallelize_module``) and ``fully_shard`` over the
data-parallel dimension, as in Lightning. Data is sharded over the data-parallel dimension only:
the ranks of one tensor- or pipeline-parallel group read the same batch. With
``pipeline_parallel_size > 1`` each rank keeps only its stages of the Module and
``run_pipeline`` runs a ``torch.distributed.pipelining`` schedule inside ``training_step``.
With ``context_parallel_size > 1`` the strategy splits each training batch's sequences over the
context-parallel ranks and makes ``F.scaled_dot_product_attention`` attend over whole sequences
(``_context_parallel``); FSDP then shards over data x context parallel (:attr:`fsdp_mesh`), so
gradients are averaged over both. With ``expert_parallel_size > 1`` the data-parallel ranks are
split into ``"expert_data_parallel"`` x ``"expert_parallel"``: the Module shards its MoE experts over
the latter with ``ExpertParallel`` (``_expert_parallel``) and over the former with ``fully_shard``
(:attr:`expert_fsdp_mesh`).
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
from phalanx.strategies.sharded import ShardedParameters, has_meta_tensors, materialize_meta, modules_needing_init
from phalanx_strategy_model_parallel._block_options import apply_block_options, resolve_block_options
from phalanx_strategy_model_parallel._checks import (
    check_configure_model,
    check_context_parallel_sharding,
    check_tensor_parallel_divisibility,
)
from phalanx_strategy_model_parallel._context_parallel import (
    SeqDims,
    check_seq_dims,
)
from phalanx_strategy_model_parallel._expert_parallel import prepare_expert_parallel
from phalanx_strategy_model_parallel._layout import (
    DATA_PARALLEL,
    DATA_PARALLEL_CONTEXT_PARALLEL,
    MeshLayout,
    check_size,
    resolve_layout,
)
from phalanx_strategy_model_parallel._pipeline import SCHEDULES, check_schedule_name
from phalanx_strategy_model_parallel._pipeline_setup import PipelineSetup
from phalanx_strategy_model_parallel._strategy_checkpointing import ModelParallelCheckpointing
from phalanx_strategy_model_parallel._strategy_context_parallel import ContextParallelSteps

__all__ = ["ModelParallelStrategy"]

#: Precisions this strategy runs; "16-mixed" needs a GradScaler across shards and stages, which
#: neither DTensor tensor parallel nor pipelining schedules drive (use bf16).
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")


class ModelParallelStrategy(ModelParallelCheckpointing, ContextParallelSteps, ShardedParameters, ParallelStrategy):
    """N-D parallel training: data (hybrid) x context x tensor x pipeline parallel on one DeviceMesh.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        data_parallel_size: Ranks that hold different data (FSDP shards over them). ``"auto"``:
            the number of nodes when tensor_parallel_size is "auto" too (Lightning's meaning), else
            whatever the other sizes leave of the world.
        tensor_parallel_size: Ranks one layer is split over. ``"auto"``: the devices of one node
            (divided by pipeline_parallel_size) when both are "auto", else what is left.
        pipeline_parallel_size: Consecutive stages of the model on different ranks (1: none).
        context_parallel_size: Ranks one sequence is split over (1: none). Every training batch
            tensor is cut along its sequence dim into ``2 x size`` chunks (rank ``i`` keeps chunks
            ``i`` and ``2 x size - 1 - i``, balancing causal attention work) and every
            ``F.scaled_dot_product_attention`` in the model attends over the whole sequence.
            Validation, test and predict see whole sequences.
        context_parallel_seq_dims: The sequence dim: an int for every batch tensor with more dims
            (default 1), or a dict from batch key to dim (None: not split) for dict batches.
        data_parallel_replicate_size: Hybrid sharding (HSDP): replicas of the model; FSDP shards
            within each replica over ``data_parallel_shard_size`` ranks. Default 1 (plain FSDP).
        data_parallel_shard_size: Ranks one replica is sharded over; default: what
            ``data_parallel_size / data_parallel_replicate_size`` leaves.
        expert_parallel_size: Ranks the experts of each MoE layer are split over (1: none). They
            are data-parallel ranks (shard ranks under HSDP), so it must divide that size; mark the
            experts with :class:`~phalanx_strategy_model_parallel.ExpertParallel` in
            ``configure_model`` and shard them over :attr:`expert_fsdp_mesh`.
        pipeline_schedule: A ``torch.distributed.pipelining`` schedule: ``"1f1b"`` (default; one
            stage per rank, least activation memory), ``"gpipe"``; several stages per rank (rank
            ``r`` runs ``r, r + pp, ...``) with a smaller bubble: ``"interleaved_1f1b"``,
            ``"looped_bfs"``, ``"interleaved_zero_bubble"``; two per rank in a V (rank ``r`` runs
            ``r`` and ``2 pp - 1 - r``): ``"zbv_zero_bubble"``, ``"dualpipe_v"``. The zero-bubble
            ones and DualPipeV split backward into input and weight gradients and do not run
            with ``compile_policy``.
        num_microbatches: Microbatches each batch is split into under pipeline parallel; default
            twice the number of stages. The per-rank batch size must be a multiple; 1F1B needs
            at least pipeline_parallel_size, DualPipeV at least the number of stages.
        save_distributed_checkpoint: True (default): every rank writes its shards into a DCP
            directory (fast, reshardable). False: rank 0 writes one consolidated file.
        activation_checkpointing_policy: Blocks whose activations are recomputed in backward, as
            for ``FSDPStrategy``: a class, a set of classes or a predicate (full recomputation), or
            ``ActivationCheckpointing({Block}, mode="selective")``
            (:mod:`phalanx.utilities.activation_checkpointing`). Applied after ``configure_model``.
        compile_policy: Regional compile: blocks whose ``forward`` is compiled on its own after
            parallelization (same forms); None compiles nothing per block.
        compile_kwargs: Options for the per-block ``torch.compile`` (``backend``, ``mode``, ...).
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
        context_parallel_size: int = 1,
        context_parallel_seq_dims: SeqDims = 1,
        data_parallel_replicate_size: int = 1,
        data_parallel_shard_size: int | None = None,
        expert_parallel_size: int = 1,
        pipeline_schedule: str = "1f1b",
        num_microbatches: int | None = None,
        save_distributed_checkpoint: bool = True,
        activation_checkpointing_policy: Any = None,
        compile_policy: Any = None,
        compile_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        parallel, _ = split_parallel_arguments(kwargs, owner=type(self))  # it forwards nothing: others are refused
        self.block_options = resolve_block_options(
            activation_checkpointing_policy=activation_checkpointing_policy,
            compile_policy=compile_policy,
            compile_kwargs=compile_kwargs,
        )
        self._sizes = (
            check_size("data_parallel_size", data_parallel_size, allow_auto=True),
            check_size("tensor_parallel_size", tensor_parallel_size, allow_auto=True),
            int(check_size("pipeline_parallel_size", pipeline_parallel_size, allow_auto=False)),
        )
        self._mesh_sizes: dict[str, Any] = {
            "context_parallel_size": int(check_size("context_parallel_size", context_parallel_size, allow_auto=False)),
            "data_parallel_replicate_size": int(
                check_size("data_parallel_replicate_size", data_parallel_replicate_size, allow_auto=False)
            ),
            "data_parallel_shard_size": None
            if data_parallel_shard_size is None
            else int(check_size("data_parallel_shard_size", data_parallel_shard_size, allow_auto=False)),
            "expert_parallel_size": int(check_size("expert_parallel_size", expert_parallel_size, allow_auto=False)),
        }
        if self._mesh_sizes["context_parallel_size"] > 1 and self._sizes[2] > 1:
            msg = (
                f"ModelParallelStrategy(context_parallel_size={context_parallel_size}, pipeline_parallel_size="
                f"{pipeline_parallel_size}): context parallel inside pipeline stages is not supported. Fix: use one "
                "of them (context_parallel_size=1 or pipeline_parallel_size=1)."
            )
            raise MisconfigurationError(msg)
        self.context_parallel_seq_dims = check_seq_dims(context_parallel_seq_dims)
        check_schedule_name(pipeline_schedule)
        if SCHEDULES[pipeline_schedule].split_backward and compile_policy is not None and self._sizes[2] > 1:
            msg = (
                f"ModelParallelStrategy(pipeline_schedule={pipeline_schedule!r}, compile_policy=...): this schedule "
                "computes input and weight gradients separately, which torch.distributed.pipelining does not support "
                "for compiled stages. Fix: remove compile_policy, or choose a schedule without the split: "
                f"{[name for name, spec in SCHEDULES.items() if not spec.split_backward]}."
            )
            raise MisconfigurationError(msg)
        if num_microbatches is not None:
            check_size("num_microbatches", num_microbatches, allow_auto=False)
        super().__init__(accelerator, **parallel)
        self.pipeline_schedule = pipeline_schedule
        self.num_microbatches = num_microbatches
        self.save_distributed_checkpoint = bool(save_distributed_checkpoint)
        self._layout: MeshLayout | None = None
        self._flat_meshes: dict[str, DeviceMesh] = {}
        self._device_mesh: DeviceMesh | None = None
        self._pipeline: PipelineSetup | None = None
        self._trainer: Any = None
        self._cp_checked = False

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
        self._layout = resolve_layout(
            *self._sizes, num_nodes=self.num_nodes, num_processes=self.num_processes, **self._mesh_sizes
        )

    @property
    def layout(self) -> MeshLayout:
        """The resolved sizes; known after the Trainer configured the strategy."""
        if self._layout is None:
            self._layout = resolve_layout(
                *self._sizes, num_nodes=self.num_nodes, num_processes=self.num_processes or 1, **self._mesh_sizes
            )
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
    def context_parallel_size(self) -> int:
        return self.layout.context_parallel

    @property
    def data_parallel_replicate_size(self) -> int:
        return self.layout.data_parallel_replicate

    @property
    def data_parallel_shard_size(self) -> int:
        return self.layout.data_parallel_shard

    @property
    def expert_parallel_size(self) -> int:
        return self.layout.expert_parallel

    @property
    def expert_fsdp_mesh(self) -> DeviceMesh:
        """The mesh to pass to ``fully_shard`` for expert weights: the data-parallel ranks that hold the same experts.

        ``expert_data_parallel`` (times context parallel when used; 2-D with HSDP); :attr:`fsdp_mesh`
        when ``expert_parallel_size == 1``. See :class:`~phalanx_strategy_model_parallel.ExpertParallel`.
        """
        return self._mesh_of(self.layout.expert_fsdp_dims)

    def _mesh_of(self, dims: tuple[str, ...]) -> DeviceMesh:
        if len(dims) == 1:
            flat = self._flat_meshes.get(dims[0])
            return flat if flat is not None else self.device_mesh[dims[0]]
        return self.device_mesh[dims]

    @property
    def fsdp_mesh(self) -> DeviceMesh:
        """The mesh to pass to ``fully_shard``: data parallel, times context parallel when used.

        1-D (plain FSDP) or, with ``data_parallel_replicate_size > 1``, 2-D ``(replicate, shard)``,
        which ``fully_shard`` runs as HSDP. Context-parallel ranks hold other tokens of the same
        samples, so their gradients must be averaged with the data-parallel ones: FSDP over this
        mesh does it in its reduce-scatter.
        """
        return self._mesh_of(self.layout.fsdp_dims)

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
    def keep_process_group_after_teardown(self) -> bool:
        """DTensor parameters and pipeline stages reference the mesh's groups: keep them until exit."""
        return self._device_mesh is not None

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
            mesh = init_device_mesh(self.root_device.type, layout.shape, mesh_dim_names=layout.dim_names)
            for name, dims in layout.flattened:  # every rank, same order: each creates process groups
                self._flat_meshes[name] = mesh[dims]._flatten(name)
            self._device_mesh = mesh
        module = self.module
        if module is not None and not isinstance(getattr(type(module), "device_mesh", None), property):
            module.device_mesh = self._device_mesh  # plain attribute: a DeviceMesh is no Module/Parameter

    def setup(self, trainer: Any) -> None:
        """Remember the Trainer (accumulation and clipping settings), then the base template."""
        self._trainer = trainer
        self._cp_checked = False
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
            materialize_meta(module, modules_needing_init(module), self.root_device)
        else:
            for tensor in (*module.parameters(), *module.buffers()):
                if not isinstance(tensor, DTensor) and tensor.device != self.root_device:
                    module.to(self.root_device)
                    break
        check_tensor_parallel_divisibility(module, layout.tensor_parallel)
        if not parallelized and self._pipeline is None and not isinstance(module, FSDPModule):
            fully_shard(module, mesh=self.fsdp_mesh)  # pure data (x context) parallel: shard like FSDP
        if layout.context_parallel > 1:
            check_context_parallel_sharding(module, layout.context_parallel)
        batch = self._mesh_of((DATA_PARALLEL_CONTEXT_PARALLEL if layout.context_parallel > 1 else DATA_PARALLEL,))
        clip = getattr(self._trainer, "gradient_clip_val", None) if training else None
        prepare_expert_parallel(module, layout, batch.get_group() if batch.size() > 1 else None, gradient_clip_val=clip)
        if self._pipeline is not None:
            self._pipeline.build(training=training)
        apply_block_options(self.block_options, module, is_global_zero=self.is_global_zero)
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
        module = self.module
        return module if isinstance(module, FSDPModule) else None

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The Module's step; under pipeline parallel it must call :meth:`run_pipeline` once."""
        if self._pipeline is None:
            if self.layout.context_parallel > 1:
                return self._context_parallel_step(*args, **kwargs)
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
        sizes = "".join(f", {k}={v!r}" for k, v in self._mesh_sizes.items())
        return (
            f"ModelParallelStrategy(data_parallel_size={dp!r}, tensor_parallel_size={tp!r}, "
            f"pipeline_parallel_size={pp}{sizes}, pipeline_schedule={self.pipeline_schedule!r}, "
            f"save_distributed_checkpoint={self.save_distributed_checkpoint})"
        )
