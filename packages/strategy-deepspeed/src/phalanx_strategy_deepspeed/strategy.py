"""DeepSpeedStrategy: ZeRO stages 1-3 with CPU / NVMe offload, through the DeepSpeed engine.

The strategy hands the Module, its optimizer and a generated (or user-given) config to
``deepspeed.initialize``; the resulting engine owns backward, gradient accumulation, clipping and
the optimizer step, so the Trainer's settings for those are written into the config instead of
being applied by the loop. Processes are started by phalanx's script launcher (or torchrun, SLURM,
the ``deepspeed`` launcher), the process group is created before DeepSpeed sees it, and deepspeed
is imported only after the accelerator is known, because DeepSpeed fixes its accelerator on import.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
from collections.abc import Generator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, ClassVar

from phalanx.accelerators.accelerator import Accelerator
from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies.configuration import StrategyConfiguration
from phalanx.strategies.parallel import ParallelStrategy, split_parallel_arguments
from phalanx.utilities.activation_checkpointing import apply_activation_checkpointing, resolve_activation_checkpointing
from phalanx_strategy_deepspeed import _config, _engine
from phalanx_strategy_deepspeed._checkpoint import DeepSpeedCheckpointing
from phalanx_strategy_deepspeed._precision import DeepSpeedPrecision
from phalanx_strategy_deepspeed._runtime import (
    communication_backend,
    import_deepspeed,
    reset_comm_backend,
    skip_shm_comm_build,
)

__all__ = ["DeepSpeedStrategy"]


class DeepSpeedStrategy(DeepSpeedCheckpointing, ParallelStrategy):
    """Train with DeepSpeed ZeRO: optimizer state (1), gradients (2) and parameters (3) sharded.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy` ("cpu" or "cuda").
        zero_optimization: Enable ZeRO; False runs DeepSpeed as plain data parallel.
        stage: ZeRO stage, 0-3. Ignored when ``config`` is given (the config says).
        remote_device: Where ``zero.Init`` puts parameters under stage 3 ("cpu", "nvme"); default
            the compute device.
        offload_optimizer: Keep optimizer state (and the step) in CPU memory or on NVMe.
        offload_parameters: Stage 3: keep parameters in CPU memory or on NVMe between uses.
        offload_params_device: "cpu" or "nvme".
        offload_optimizer_device: "cpu" or "nvme".
        nvme_path: Directory on a fast local disk; required when anything goes to NVMe.
        config: A DeepSpeed config dict, or a path to a JSON file; it wins over the arguments above.
            The Trainer's accumulation and clipping fill keys it leaves unset.
        logging_batch_size_per_gpu: ``train_micro_batch_size_per_gpu`` for DeepSpeed's throughput
            logs; "auto" reads the train dataloader's batch size.
        logging_level: Level of DeepSpeed's logger (it is chatty at INFO).
        zero_allow_untested_optimizer: Let ZeRO wrap optimizers DeepSpeed has not tested.
        load_full_weights: Accepted for Lightning compatibility and has no effect: phalanx tells the
            formats apart by themselves, so a ``ckpt_path`` *file* (a converted or another strategy's
            checkpoint) is always read as full weights, and a directory as DeepSpeed's sharded one.
        exclude_frozen_parameters: Leave parameters without gradients out of saved checkpoints.
        build_cpu_comm_op: On CPU, let DeepSpeed JIT-compile its shared-memory all-reduce op when
            the process group is set up. It serves only DeepSpeed's inference kernels, not ZeRO
            training, and takes minutes to build, so it is skipped by default.
        activation_checkpointing_policy: Blocks whose activations are recomputed in backward, as
            under ``fsdp`` and ``model_parallel``: a block class or a set of them (full recomputation),
            or ``ActivationCheckpointing({Block}, mode="selective")`` (keep matmul outputs, recompute
            the rest). Applied with torch's checkpoint before the engine is built, so it works with
            every ZeRO stage and keeps parameter names (and checkpoints) unchanged. DeepSpeed's own
            ``partition_activations`` knobs are separate and only act on ``deepspeed.checkpointing``.
        gather_on_teardown: Stage 3: when a run ends, gather the full weights back into the Module
            (every rank holds them), as after any other strategy, so it can be evaluated, saved or
            trained again. Set False for models too large for one rank's memory; the Module is then
            only usable through checkpoints.
        **kwargs: Every :class:`~phalanx.strategies.parallel.ParallelStrategy` argument
            (``parallel_devices``, ``cluster_environment``, ``checkpoint_io``, ``precision_plugin``,
            ``process_group_backend`` (default DeepSpeed's choice for the accelerator: nccl on
            CUDA, ccl on CPU when oneCCL is installed, else gloo), ``timeout``; only
            ``start_method="popen"``); the rest are ZeRO / offload / aio / activation-checkpointing /
            loss-scale knobs with Lightning's names and defaults (see ``_config.TUNING_DEFAULTS``).

    Raises:
        MisconfigurationError: Unknown stage or offload device, NVMe without ``nvme_path``, a config
            file that is missing or does not parse, or an unknown tuning argument.
    """

    strategy_name: ClassVar[str] = "deepspeed"
    supported_start_methods = ("popen",)

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        zero_optimization: bool = True,
        stage: int = 2,
        remote_device: str | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        offload_params_device: str = "cpu",
        offload_optimizer_device: str = "cpu",
        nvme_path: str | None = None,
        config: dict[str, Any] | str | os.PathLike[str] | None = None,
        logging_batch_size_per_gpu: int | str = "auto",
        logging_level: int = logging.WARN,
        zero_allow_untested_optimizer: bool = True,
        load_full_weights: bool = False,
        exclude_frozen_parameters: bool = False,
        build_cpu_comm_op: bool = False,
        gather_on_teardown: bool = True,
        activation_checkpointing_policy: Any = None,
        **kwargs: Any,
    ) -> None:
        parallel, tuning = split_parallel_arguments(kwargs)
        super().__init__(accelerator, **parallel)
        self._options = _config.DeepSpeedOptions(
            stage=stage,
            zero_optimization=zero_optimization,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            offload_optimizer_device=offload_optimizer_device,
            offload_params_device=offload_params_device,
            nvme_path=nvme_path,
            logging_batch_size_per_gpu=logging_batch_size_per_gpu,
            zero_allow_untested_optimizer=zero_allow_untested_optimizer,
            tuning=dict(tuning),
        )
        if remote_device is not None:
            _config.check_offload_device(remote_device, "DeepSpeedStrategy(remote_device=...)")
        user_config = _config.load_config(config)
        self.config: dict[str, Any] = user_config if user_config is not None else _config.build_config(self._options)
        _config.check_config(self.config)
        if remote_device == "nvme" and not nvme_path:
            msg = "DeepSpeedStrategy(remote_device='nvme') needs nvme_path='/path/on/a/local/disk'; or use remote_device='cpu'."
            raise MisconfigurationError(msg)
        self.remote_device = remote_device
        self.load_full_weights = load_full_weights
        self.exclude_frozen_parameters = exclude_frozen_parameters
        self._logging_level = logging_level
        self.build_cpu_comm_op = build_cpu_comm_op
        self.gather_on_teardown = gather_on_teardown
        self.activation_checkpointing_policy = resolve_activation_checkpointing(
            activation_checkpointing_policy, owner="DeepSpeedStrategy"
        )
        self._failed = False
        self._run_config: dict[str, Any] | None = None

    # ------------------------------------------------------------------ configuration
    @property
    def zero_stage(self) -> int:
        """The ZeRO stage in effect (from the config, which the arguments generated or the user gave)."""
        return _config.zero_stage_of(self.config)

    @property
    def zero_stage_3(self) -> bool:
        return self.zero_stage == 3

    def adapt_precision_plugin(self, precision_plugin: Precision) -> Precision:
        """Always a :class:`DeepSpeedPrecision`, converted by name: an unsupported one fails at ``Trainer(...)``."""
        if isinstance(precision_plugin, DeepSpeedPrecision):
            return precision_plugin
        return DeepSpeedPrecision(precision_plugin.precision)

    @property
    def handles_gradient_accumulation(self) -> bool:
        """The engine accumulates (``gradient_accumulation_steps``), so the loop steps every batch."""
        return True

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Sharded state can only be loaded into an existing engine."""
        return True

    @property
    def restore_optimizer(self) -> bool:
        """The engine restores its (sharded) optimizer state itself."""
        return False

    @property
    def deepspeed_engine(self) -> Any:
        """The DeepSpeed engine after :meth:`setup` (it is :attr:`model`), else None."""
        return self.model if hasattr(self.model, "backward") and self.model is not self.module else None

    def configure(self, config: StrategyConfiguration) -> None:
        """Also refuse a precision the devices cannot run (fp16 on CPU) before anything launches."""
        super().configure(config)
        self._check_precision_for_devices()

    def _check_precision_for_devices(self) -> None:
        devices = self.parallel_devices
        precision = self.precision_plugin
        if devices and isinstance(precision, DeepSpeedPrecision):
            precision.check_device(devices[0])

    # ------------------------------------------------------------------ setup
    def default_process_group_backend(self) -> str:
        """DeepSpeed's choice for its accelerator (ccl on CPU when oneCCL is installed, else gloo)."""
        return communication_backend(None)

    def setup_distributed(self) -> None:
        """Pick DeepSpeed's accelerator, create the process group, then hand it to deepspeed.comm.

        deepspeed is imported only now, after the device is known, because it fixes its
        accelerator on import.
        """
        device = self.root_device
        precision = self.precision_plugin
        assert isinstance(precision, DeepSpeedPrecision)
        precision.check_device(device)
        deepspeed = import_deepspeed("cuda" if device.type == "cuda" else device.type)
        logging.getLogger("DeepSpeed").setLevel(self._logging_level)
        super().setup_distributed()
        kwargs: dict[str, Any] = {
            "dist_backend": self.process_group_backend,
            "auto_mpi_discovery": False,
            "verbose": False,
        }
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        with skip_shm_comm_build(device.type == "cpu" and not self.build_cpu_comm_op):
            deepspeed.init_distributed(**kwargs)

    def setup(self, trainer: Any) -> None:
        """Build the engine: the Module, its optimizer (or the config's) and the completed config."""
        self.require_accelerator().setup(trainer)
        module = self.require_module()
        self._trainer = trainer
        stale = _engine.stale_partitions(module)
        if stale:
            msg = (
                f"{type(module).__qualname__} still holds parameters ({', '.join(stale[:3])}, ...) partitioned by an "
                "earlier ZeRO-3 run in this process, whose process group is gone. Fix: leave "
                "DeepSpeedStrategy(gather_on_teardown=True) (the default) on the earlier run so the Module gets its "
                "weights back, or build a new Module and pass ckpt_path=... to load a checkpoint."
            )
            raise MisconfigurationError(msg)
        fitting = bool(getattr(trainer, "training", True))
        self.model = self.precision_plugin.convert_module(module)
        apply_activation_checkpointing(module, self.activation_checkpointing_policy, owner="DeepSpeedStrategy")
        if not self.zero_stage_3:
            self.model_to_device()
        config = self._config_for_run(trainer)
        self._run_config = config
        deepspeed = import_deepspeed()
        args = argparse.Namespace(device_rank=self.root_device.index or 0)
        if fitting:
            optimizer, schedulers = _engine.client_optimizer(module, config)
            scheduler = schedulers[0].scheduler if schedulers else None
            params = [p for p in module.parameters() if p.requires_grad] if optimizer is None else None
            engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(
                args=args,
                model=module,
                optimizer=optimizer,
                model_parameters=params,
                lr_scheduler=scheduler,
                config=config,
                dist_init_required=False,
            )
            self.optimizers = [ds_optimizer]
            self.lr_scheduler_configs = _engine.adopt_scheduler(engine, ds_scheduler, schedulers)
        else:
            engine, _, _, _ = deepspeed.initialize(
                args=args,
                model=module,
                config=_engine.inference_config(config, stage3=self.zero_stage_3),
                model_parameters=[],
                dist_init_required=False,
            )
            self.optimizers = []
            self.lr_scheduler_configs = []
        self.model = engine
        self.setup_precision_plugin()

    def _config_for_run(self, trainer: Any) -> dict[str, Any]:
        """The strategy's config completed with the Trainer's accumulation, clipping, batch and precision."""
        config = copy.deepcopy(self.config)
        _config.apply_trainer_settings(
            config,
            accumulate_grad_batches=int(getattr(trainer, "accumulate_grad_batches", 1) or 1),
            gradient_clip_val=getattr(trainer, "gradient_clip_val", None),
            gradient_clip_algorithm=getattr(trainer, "gradient_clip_algorithm", None),
            micro_batch_size=_engine.auto_batch_size(trainer),
        )
        _config.apply_precision(config, self.precision_plugin.precision, self._options)
        offloads = config.get("zero_optimization", {}).get("offload_optimizer", {})
        if self.root_device.type == "cpu" and offloads and offloads.get("device", "none") != "none":
            # The parameters already live in CPU memory: DeepSpeedCPUAdam (minutes of JIT compile)
            # buys nothing over the user's torch optimizer here.
            config.setdefault("zero_force_ds_cpu_optimizer", False)
        _config.check_config(config)
        return config

    # ------------------------------------------------------------------ model creation
    @contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        """Under stage 3, layers created in ``configure_model`` are partitioned as they are built."""
        if not self.zero_stage_3:
            yield
            return
        deepspeed = import_deepspeed()
        config = copy.deepcopy(self.config)
        if "train_batch_size" not in config:
            config.setdefault("train_micro_batch_size_per_gpu", 1)
        _config.apply_precision(config, self.precision_plugin.precision, self._options)
        with deepspeed.zero.Init(remote_device=self.remote_device, config_dict_or_path=config):
            yield

    def tensor_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[None]:
        """Stage 3 lets ``zero.Init`` place and type tensors; otherwise the base behaviour."""
        if self.zero_stage_3:
            return nullcontext()
        return super().tensor_init_context(empty_init)

    def block_backward_sync(self) -> AbstractContextManager[Any]:
        """Nothing to block: the engine knows the accumulation boundary from its config."""
        return nullcontext()

    # ------------------------------------------------------------------ teardown
    def on_exception(self, exception: BaseException) -> None:
        """Remember the failure: teardown must not start a collective other ranks may never join."""
        self._failed = True
        super().on_exception(exception)

    def teardown(self) -> None:
        """Release the engine (ZeRO-3: weights gathered back), the process group, deepspeed.comm's state."""
        created = self.created_process_group
        engine = self.deepspeed_engine
        if engine is not None:
            module = self.require_module()
            gather = self.zero_stage_3 and self.gather_on_teardown and not self._failed
            _engine.release_engine(engine, module, gather=gather)
            self.model = module
        self._failed = False
        self.optimizers = []
        super().teardown()
        if created:
            reset_comm_backend()

    def __repr__(self) -> str:
        return f"DeepSpeedStrategy(stage={self.zero_stage}, offload={self._offload_summary()})"

    def _offload_summary(self) -> dict[str, str]:
        zero = self.config.get("zero_optimization", {})
        return {
            key: zero[key].get("device", "cpu")
            for key in ("offload_optimizer", "offload_param")
            if isinstance(zero.get(key), dict)
        }
