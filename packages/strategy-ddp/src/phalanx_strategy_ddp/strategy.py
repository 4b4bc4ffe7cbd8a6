"""DDPStrategy: PyTorch DistributedDataParallel, one process per device, on one or many nodes.

Each process holds a full replica of the model; DistributedDataParallel all-reduces (averages) the
gradients during backward, so every replica takes the same optimizer step. What differs between
``ddp``, ``ddp_spawn`` and ``ddp_fork`` is only how the processes are started (the launcher).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from phalanx._optim import optimizers_to_device
from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.errors import MisconfigurationError
from phalanx.launchers.launcher import Launcher
from phalanx.launchers.multiprocessing import MultiProcessingLauncher, check_start_method
from phalanx.launchers.subprocess_script import SubprocessScriptLauncher
from phalanx.precision.precision import Precision
from phalanx.strategies.parallel import ParallelStrategy
from phalanx_strategy_ddp._backend import default_backend, validate_backend, validate_backend_for_device

__all__ = ["DDPStrategy"]

START_METHODS = ("popen", "spawn", "fork", "forkserver")
#: Imported by DistributedDataParallel's constructor on first use (torch._dynamo: seconds
#: of work); imported once before forking, every forked worker starts with it.
_DDP_LAZY_IMPORTS = ("torch._dynamo",)


class DDPStrategy(ParallelStrategy):
    """Data-parallel training with ``torch.nn.parallel.DistributedDataParallel``.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        parallel_devices: One device per local process (filled by the Trainer from ``devices``).
        cluster_environment: Ranks and rendezvous; detected (torchrun, SLURM, else local) when None.
        checkpoint_io: See :class:`~phalanx.strategies.strategy.Strategy`.
        precision_plugin: See :class:`~phalanx.strategies.strategy.Strategy`.
        process_group_backend: "gloo", "nccl", "mpi", ... ; default gloo on CPU, nccl on CUDA.
        timeout: How long a collective may wait for the other ranks before failing (passed to
            ``init_process_group``); torch's default (30 minutes for gloo) when None.
        start_method: "popen" re-runs the script (``ddp``); "spawn", "fork", "forkserver" use
            torch.multiprocessing (``ddp_spawn``, ``ddp_fork`` / ``ddp_notebook``).
        ddp_comm_state: State object passed to ``ddp_comm_hook``.
        ddp_comm_hook: A DDP communication hook (e.g. ``default_hooks.fp16_compress_hook``),
            registered right after wrapping.
        ddp_comm_wrapper: Wraps ``ddp_comm_hook`` (e.g. ``default_hooks.fp16_compress_wrapper``).
        sync_batchnorm: Convert BatchNorm layers to SyncBatchNorm when fitting (the Trainer sets it
            from ``Trainer(sync_batchnorm=True)``).
        **ddp_kwargs: Passed to ``DistributedDataParallel``: ``find_unused_parameters``,
            ``static_graph``, ``gradient_as_bucket_view``, ``bucket_cap_mb``, ...
    """

    strategy_name: ClassVar[str] = "ddp"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = None,
        start_method: str = "popen",
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        sync_batchnorm: bool = False,
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        if start_method not in START_METHODS:
            msg = (
                f"DDPStrategy(start_method={start_method!r}) is not a launch method; choose one of "
                f"{', '.join(START_METHODS)} ('popen' re-runs the script, as strategy='ddp' does)."
            )
            raise MisconfigurationError(msg)
        if start_method != "popen":
            check_start_method(start_method, cuda_initialized=False)  # the platform; CUDA at launch
        if timeout is not None and not isinstance(timeout, timedelta):
            msg = f"DDPStrategy(timeout={timeout!r}) must be a datetime.timedelta, e.g. timedelta(minutes=5)."
            raise MisconfigurationError(msg)
        self._process_group_backend = validate_backend(process_group_backend)
        self._timeout = timeout
        self._start_method = start_method
        self._ddp_comm_state = ddp_comm_state
        self._ddp_comm_hook = ddp_comm_hook
        self._ddp_comm_wrapper = ddp_comm_wrapper
        self._comm_hooks: list[tuple[Callable[..., Any], object | None]] = []
        self.sync_batchnorm = sync_batchnorm
        self._ddp_kwargs = ddp_kwargs

    # ------------------------------------------------------------------ configuration
    @property
    def process_group_backend(self) -> str:
        """The backend in use or about to be: the one given, else gloo on CPU / nccl on CUDA."""
        return self._process_group_backend or default_backend(self.root_device)

    @property
    def start_method(self) -> str:
        return self._start_method

    @property
    def timeout(self) -> timedelta | None:
        return self._timeout

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """Keyword arguments passed to ``DistributedDataParallel``."""
        return self._ddp_kwargs

    @property
    def launcher(self) -> Launcher:
        """The launcher for :attr:`start_method`; built on first use, after devices are known."""
        if self._launcher is None:
            self._configure_launcher()
        return self._launcher  # type: ignore[no-any-return]

    def _configure_launcher(self) -> None:
        """popen -> re-run the script; spawn/fork -> torch.multiprocessing.

        Also the earliest point where devices, nodes and the cluster environment are all known, so
        a mismatch with torchrun's or SLURM's allocation fails here, before anything is launched.

        When something else already started the processes (torchrun, srun, a re-run child), the
        script launcher is used whatever the start method: it then starts nothing and only runs the
        stage, so ``ddp_spawn`` under torchrun does not spawn a second set of workers.
        """
        self._check_sync_batchnorm()
        env = self.cluster_environment
        if self.num_processes:  # a scheduler's allocation must match devices x num_nodes
            env.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if self._start_method == "popen" or env.creates_processes_externally:
            self._launcher = SubprocessScriptLauncher(env, self.num_processes, self.num_nodes)
        else:
            self._launcher = MultiProcessingLauncher(self, start_method=self._start_method, preload=_DDP_LAZY_IMPORTS)

    def _on_configuration_change(self) -> None:
        self._launcher = None

    def _check_sync_batchnorm(self) -> None:
        """Refuse SyncBatchNorm on CPU before any process starts: torch only runs it on GPUs."""
        devices = self.parallel_devices or []
        if self.sync_batchnorm and devices and devices[0].type == "cpu":
            msg = (
                "sync_batchnorm=True needs GPU processes: torch's SyncBatchNorm does not run on CPU "
                f"(devices: {[str(d) for d in devices]}). Fix: remove sync_batchnorm=True for CPU "
                "training, or train on accelerator='cuda'."
            )
            raise MisconfigurationError(msg)

    # ------------------------------------------------------------------ setup
    def setup_environment(self) -> None:
        """Create the process group, then select this process's device."""
        self.setup_distributed()
        super().setup_environment()

    def setup_distributed(self) -> None:
        """Compute the ranks and join the process group with the configured backend and timeout."""
        self.set_world_ranks()
        self._set_num_threads_if_needed(self.num_processes)
        backend = self.process_group_backend
        validate_backend_for_device(backend, self.root_device)
        self._init_process_group(backend, self._timeout)

    def setup(self, trainer: Any) -> None:
        """Move the model, wrap it in DDP (when fitting), then build optimizers and the precision.

        DDP wraps before the optimizers are created so that a :meth:`configure_ddp` override may
        replace parameters (e.g. a custom wrapper); evaluation-only runs are not wrapped, since no
        gradients need reducing, but rank 0's weights are broadcast so every rank evaluates the
        same model.
        """
        self._require_accelerator().setup(trainer)
        self._require_module()
        assert self.model is not None
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        fitting = bool(getattr(trainer, "training", True))
        if fitting:
            if self.sync_batchnorm:
                self._check_sync_batchnorm()
                self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
            self.configure_ddp()
            self.setup_optimizers(trainer)
        else:
            self._sync_module_states()
        self.setup_precision_plugin()
        if fitting:
            optimizers_to_device(self.optimizers, self.root_device)

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    def determine_ddp_device_ids(self) -> list[int] | None:
        """``device_ids`` for DistributedDataParallel: None on CPU, ``[index]`` on a GPU."""
        if self.root_device.type == "cpu":
            return None
        return [self.root_device.index if self.root_device.index is not None else 0]

    def _setup_model(self, model: nn.Module) -> DistributedDataParallel:
        """Wrap ``model`` in DistributedDataParallel with :attr:`ddp_kwargs`."""
        return DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)

    def configure_ddp(self) -> None:
        """Wrap the model for DDP; override to use your own wrapper (see the docs' CustomDDPStrategy)."""
        assert self.model is not None
        self.model = self._setup_model(self.model)
        self._register_ddp_hooks()

    # ------------------------------------------------------------------ communication hooks
    def register_ddp_comm_hook(self, hook: Callable[..., Any], state: object | None = None) -> None:
        """Register a DDP communication hook now (if wrapped) or right after wrapping.

        Args:
            hook: ``hook(state, bucket) -> Future[Tensor]``, e.g. from
                ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``.
            state: Passed to ``hook`` as its first argument (e.g. a process group or PowerSGD state).
        """
        if isinstance(self.model, DistributedDataParallel):
            self.model.register_comm_hook(state=state, hook=hook)
        else:
            self._comm_hooks.append((hook, state))

    def _register_ddp_hooks(self) -> None:
        if not isinstance(self.model, DistributedDataParallel):
            return
        if self._ddp_comm_hook is not None:
            hook = self._ddp_comm_hook
            if self._ddp_comm_wrapper is not None:
                hook = self._ddp_comm_wrapper(hook)
            self.model.register_comm_hook(state=self._ddp_comm_state, hook=hook)
        for hook, state in self._comm_hooks:
            self.model.register_comm_hook(state=state, hook=hook)

    def _sync_module_states(self) -> None:
        """Broadcast rank 0's parameters and buffers (what DDP's constructor does when fitting)."""
        if not (dist.is_available() and dist.is_initialized()) or self.model is None:
            return
        with torch.no_grad():
            for tensor in [*self.model.parameters(), *self.model.buffers()]:
                dist.broadcast(tensor.data, src=0)

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> None:
        """Unwrap the model, then release the process group and the parts."""
        if isinstance(self.model, DistributedDataParallel):
            self.model = self.module
        super().teardown()

    def __repr__(self) -> str:
        return (
            f"DDPStrategy(start_method={self._start_method!r}, process_group_backend="
            f"{self._process_group_backend!r}, ddp_kwargs={self._ddp_kwargs!r})"
        )
