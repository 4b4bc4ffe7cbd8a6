"""ParallelStrategy: the complete base of every strategy that runs one process per device.

It owns everything one-process-per-device strategies share: the launcher (re-running the script,
or spawn / fork / forkserver workers), ranks from a ClusterEnvironment, the process group, the CPU
thread split, collectives over ``torch.distributed``, DistributedSampler sharding, rank 0's weights
broadcast so every replica starts equal, and SyncBatchNorm conversion. A subclass adds only what
differs: a wrapper (:meth:`~phalanx.strategies.strategy.Strategy.wrap_model`), a step
(``optimizer_step``), a checkpoint format. Used as it is, it trains N independent replicas that
start from the same weights and read disjoint data (no gradient synchronisation).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Generator, Iterable
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.errors import MisconfigurationError, closest_match
from phalanx.launchers.launcher import Launcher
from phalanx.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
from phalanx.precision.precision import Precision
from phalanx.strategies._agreement import checking_enabled
from phalanx.strategies._backend import (
    default_backend,
    destroy_process_group_at_exit,
    validate_backend,
    validate_backend_for_device,
)
from phalanx.strategies._hangs import explain_timeout, is_collective_timeout, new_check_in_group
from phalanx.strategies._parallel_collectives import ParallelCollectives
from phalanx.strategies._rendezvous import (
    DEFAULT_STORE_TIMEOUT,
    STARTUP_TIMEOUT,
    next_group_store,
    wait_for_all_ranks,
)
from phalanx.strategies.configuration import StrategyConfiguration
from phalanx.strategies.strategy import Strategy

__all__ = ["PARALLEL_ARGUMENTS", "START_METHODS", "ParallelStrategy", "split_parallel_arguments"]

#: How a ParallelStrategy starts its processes: "popen" re-runs the script (``ddp``), the others
#: are torch.multiprocessing start methods (``ddp_spawn``, ``ddp_fork`` / ``ddp_notebook``).
START_METHODS = ("popen", "spawn", "fork", "forkserver")

def split_parallel_arguments(
    kwargs: dict[str, Any],
    *,
    owner: type | None = None,
    forward_to: Callable[..., Any] | None = None,
    supplied: Iterable[str] = (),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a subclass's ``**kwargs`` into (ParallelStrategy's arguments, the rest), checking the rest.

    For subclasses whose own ``**kwargs`` go to a library object (DDP's to
    ``DistributedDataParallel``, FSDP's to ``fully_shard``): they take one ``**kwargs``, forward the
    first part to ``super().__init__`` and keep the second for the library. ParallelStrategy's
    arguments are read from its signature (:data:`PARALLEL_ARGUMENTS`); the rest are checked
    against ``forward_to``'s signature, less the ``supplied`` ones the strategy passes itself, so a
    misspelt option fails at construction, naming the closest of all the valid ones: ``owner``'s
    own (its ``__init__``'s named parameters), ParallelStrategy's and the forwarded ones. Call it
    as ``split_parallel_arguments(kwargs, owner=type(self), forward_to=..., supplied=(...))``.
    With ``owner`` and no ``forward_to`` the strategy forwards nothing: any other name is refused.
    With neither (or a ``forward_to`` that takes ``**kwargs``) the rest is returned unchecked.

    Raises:
        MisconfigurationError: a name neither ParallelStrategy nor ``forward_to`` takes, or one the
            strategy supplies itself.
    """
    base = {key: value for key, value in kwargs.items() if key in PARALLEL_ARGUMENTS}
    rest = {key: value for key, value in kwargs.items() if key not in PARALLEL_ARGUMENTS}
    if not rest or (owner is None and forward_to is None):
        return base, rest
    parameters = inspect.signature(forward_to).parameters if forward_to is not None else {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return base, rest
    name = owner.__name__ if owner is not None else "the strategy"
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    own = [] if owner is None else [
        key
        for key, p in inspect.signature(owner).parameters.items()
        if p.kind in named and key not in ("self", "accelerator")
    ]
    supplied = set(supplied)
    taken = [key for key, p in parameters.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    forwardable = [name for name in taken if name not in supplied and name != "self"]
    target = getattr(forward_to, "__qualname__", repr(forward_to)).removesuffix(".__init__") if forward_to else ""
    for key in rest:
        if key in forwardable:
            continue
        if key in supplied:
            msg = (
                f"{name}({key}=...): the strategy passes {key} to {target} itself. "
                f"Fix: drop {key}; the options {target} takes from you are: {', '.join(forwardable)}."
            )
            raise MisconfigurationError(msg)
        valid = [*own, *PARALLEL_ARGUMENTS, *forwardable]
        hint = closest_match(key, valid)
        suggestion = f" Did you mean {hint!r}?" if hint else ""
        forwarded = f" and {target}'s ({', '.join(forwardable)})" if target else ""
        msg = (
            f"{name} got an unknown option {key}={rest[key]!r}.{suggestion} It takes its own "
            f"options ({', '.join(own) or 'none'}), ParallelStrategy's ({', '.join(PARALLEL_ARGUMENTS)}){forwarded}."
        )
        raise MisconfigurationError(msg)
    return base, rest


class ParallelStrategy(ParallelCollectives, Strategy):
    """One process per device, on one or several nodes, launched and joined by the strategy itself.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        parallel_devices: One device per local process (the Trainer fills it from ``devices``);
            local rank ``i`` computes on ``parallel_devices[i]``.
        cluster_environment: Where ranks and the rendezvous come from; detected on first use
            (torchrun, SLURM, else the local machine) when ``None``.
        checkpoint_io: See :class:`~phalanx.strategies.strategy.Strategy`.
        precision_plugin: See :class:`~phalanx.strategies.strategy.Strategy`.
        process_group_backend: "gloo", "nccl", "mpi", or torch's per-device form
            ("cpu:gloo,cuda:nccl"); default gloo on CPU, nccl on CUDA.
        timeout: How long a collective waits for the other ranks before failing (a
            ``datetime.timedelta``); torch's default (30 minutes) when None.
        start_method: "popen" re-runs the script once per extra local rank; "spawn", "fork" and
            "forkserver" start workers with torch.multiprocessing (fork works in notebooks).
        sync_batchnorm: Convert BatchNorm layers to SyncBatchNorm when fitting (GPU only; the
            Trainer sets it from ``Trainer(sync_batchnorm=True)``).

    Raises:
        MisconfigurationError: An unknown start method or backend, or a timeout that is not a
            ``timedelta``.
    """

    #: Runs the Module through its wrapper only: the Trainer may take the direct step.
    passes_step_through = True

    #: Start methods this class accepts; subclasses whose state cannot travel to spawned workers
    #: narrow it (FSDP and DeepSpeed accept only "popen").
    supported_start_methods: tuple[str, ...] = START_METHODS
    #: Modules every worker imports anyway; with fork they are imported once before forking.
    launcher_preload: tuple[str, ...] = ()

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
        sync_batchnorm: bool = False,
    ) -> None:
        super().__init__(accelerator, checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        name = type(self).__name__
        if start_method not in self.supported_start_methods:
            msg = (
                f"{name}(start_method={start_method!r}) is not supported; choose one of "
                f"{', '.join(self.supported_start_methods)} ('popen' re-runs the script, as strategy='ddp' does)."
            )
            raise MisconfigurationError(msg)
        if start_method != "popen":
            from phalanx.launchers.multiprocessing import check_start_method

            check_start_method(start_method, cuda_initialized=False)  # the platform now; CUDA at launch
        if timeout is not None and not isinstance(timeout, timedelta):
            msg = f"{name}(timeout={timeout!r}) must be a datetime.timedelta or None. Fix: pass e.g. timeout=timedelta(minutes=5)."
            raise MisconfigurationError(msg)
        self._parallel_devices = list(parallel_devices) if parallel_devices is not None else None
        self._cluster_environment = cluster_environment
        self._num_nodes = 1
        self._process_group_backend = validate_backend(process_group_backend)
        self._timeout = timeout
        self._start_method = start_method
        self.sync_batchnorm = bool(sync_batchnorm)
        #: What ``convert_sync_batchnorm`` applies: ``Trainer(plugins=[LayerSync])``, else torch's SyncBatchNorm.
        self.layer_sync: LayerSync | None = None
        self._created_process_group = False
        self._check_in_group: dist.ProcessGroup | None = None
        self._check_collectives = False
        self._store: dist.Store | None = None

    # ------------------------------------------------------------------ configuration
    @property
    def cluster_environment(self) -> ClusterEnvironment:
        """The cluster environment; detected through the plugins the first time it is needed."""
        if self._cluster_environment is None:
            from phalanx.discovery import detect_cluster_environment

            self._cluster_environment = detect_cluster_environment()
        return self._cluster_environment

    @cluster_environment.setter
    def cluster_environment(self, environment: ClusterEnvironment | None) -> None:
        self._cluster_environment = environment
        self._launcher = None

    @property
    def root_device(self) -> torch.device:
        """The device of this process: ``parallel_devices[local_rank]``."""
        devices = self.parallel_devices
        if not devices:
            name = type(self).__name__
            msg = (
                f"{name} has no parallel_devices, so it does not know which device this process uses. "
                f"Pass it to a Trainer (devices=N fills them) or give {name}(parallel_devices=[...])."
            )
            raise MisconfigurationError(msg)
        return devices[self.local_rank]

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        """The devices of this node's processes, indexed by local rank."""
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        self._parallel_devices = list(devices) if devices is not None else None
        self._launcher = None

    @property
    def num_nodes(self) -> int:
        """Number of nodes (machines); set by :meth:`configure` from ``Trainer(num_nodes=...)``."""
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = int(num_nodes)
        self._launcher = None

    @property
    def num_processes(self) -> int:
        """Processes per node: one per parallel device."""
        return len(self._parallel_devices) if self._parallel_devices is not None else 0

    @property
    def requested_process_group_backend(self) -> str | None:
        """The backend passed to the constructor; None asks for :meth:`default_process_group_backend`."""
        return self._process_group_backend

    @property
    def process_group_backend(self) -> str:
        """The backend in use or about to be: the one given, else :meth:`default_process_group_backend`."""
        return self._process_group_backend or self.default_process_group_backend()

    def default_process_group_backend(self) -> str:
        """The backend when none is given: gloo on CPU, nccl on CUDA; override for another default."""
        return default_backend(self.root_device)

    @property
    def timeout(self) -> timedelta | None:
        """How long collectives wait for the other ranks (None: torch's default)."""
        return self._timeout

    @property
    def start_method(self) -> str:
        """"popen", "spawn", "fork" or "forkserver"."""
        return self._start_method

    def configure(self, config: StrategyConfiguration) -> None:
        """Take devices, nodes and environment, check them against the scheduler, build the launcher.

        The earliest point where all of them are known, so a mismatch with torchrun's or SLURM's
        allocation fails here, in the user's process, before anything is launched.
        """
        super().configure(config)
        if not self._parallel_devices:
            self._parallel_devices = list(config.parallel_devices)
        self._num_nodes = int(config.num_nodes)
        if config.cluster_environment is not None:
            self._cluster_environment = config.cluster_environment
        if config.sync_batchnorm:
            self.sync_batchnorm = True
        if config.layer_sync is not None:
            self.layer_sync = config.layer_sync
        self._check_sync_batchnorm()
        if self.num_processes:
            self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        self.set_world_ranks()
        self._launcher = self.create_launcher()

    @property
    def launcher(self) -> Launcher | None:
        """Starts the other processes; built by :meth:`configure` (or on first use when standalone)."""
        if self._launcher is None:
            self._launcher = self.create_launcher()
        return self._launcher  # type: ignore[no-any-return]

    def create_launcher(self) -> Launcher | None:
        """The launcher for :attr:`start_method`: re-run the script, or spawn / fork workers.

        When something else already started the processes (torchrun, srun, a re-run child) the
        script launcher is used whatever the start method: it then starts nothing and only runs the
        stage, so ``ddp_spawn`` under torchrun does not spawn a second set of workers. Override to
        use another launcher (XLA uses torch-xla's), or return None for a strategy that drives all
        its devices from this one process (SPMD).
        """
        from phalanx.launchers.multiprocessing import MultiProcessingLauncher
        from phalanx.launchers.subprocess_script import SubprocessScriptLauncher

        env = self.cluster_environment
        if self._start_method == "popen" or env.creates_processes_externally:
            return SubprocessScriptLauncher(env, self.num_processes, self.num_nodes)
        return MultiProcessingLauncher(self, start_method=self._start_method, preload=self.launcher_preload)

    def _check_sync_batchnorm(self) -> None:
        """Refuse SyncBatchNorm on CPU before any process starts: torch only runs it on GPUs."""
        devices = self.parallel_devices or []
        custom = self.layer_sync is not None and not isinstance(self.layer_sync, TorchSyncBatchNorm)
        if self.sync_batchnorm and not custom and devices and devices[0].type == "cpu":
            msg = (
                "sync_batchnorm=True needs GPU processes: torch's SyncBatchNorm does not run on CPU "
                f"(devices: {[str(d) for d in devices]}). Fix: remove sync_batchnorm=True for CPU "
                "training, or train on accelerator='cuda'."
            )
            raise MisconfigurationError(msg)

    # ------------------------------------------------------------------ ranks
    @property
    def global_rank(self) -> int:
        return self.cluster_environment.global_rank()

    @property
    def local_rank(self) -> int:
        return self.cluster_environment.local_rank()

    @property
    def node_rank(self) -> int:
        return self.cluster_environment.node_rank()

    @property
    def world_size(self) -> int:
        return self.cluster_environment.world_size()

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    def set_world_ranks(self) -> None:
        """Tell the environment this process's global rank and the world size (devices x nodes).

        Called once per process: by :meth:`configure`, and by a spawn/fork launcher in each worker
        after it learns its local rank. Environments whose scheduler assigned ranks ignore it.
        """
        env = self.cluster_environment
        env.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
        env.set_world_size(self.num_nodes * self.num_processes)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """Each rank reads its own shard: ``num_replicas`` is the world size (devices x nodes)."""
        replicas = self.num_nodes * self.num_processes if self.num_processes else self.world_size
        return {"num_replicas": replicas, "rank": self.global_rank}

    # ------------------------------------------------------------------ process group
    def setup_environment(self) -> None:
        """Share the CPU cores, join the process group, then select this process's device."""
        self._set_num_threads()
        self.setup_distributed()
        super().setup_environment()

    def setup_distributed(self) -> None:
        """Create the default process group with :attr:`process_group_backend` and :attr:`timeout`.

        A group that exists already (the user's, or torchrun's agent made one) is used as it is
        and left for its owner to destroy. The rendezvous address comes from the cluster
        environment, through a store kept for the whole process (``phalanx.strategies._rendezvous``),
        so phalanx never writes ``MASTER_ADDR`` / ``MASTER_PORT`` into this process's environment.
        """
        if dist.is_initialized():
            return
        backend = self.process_group_backend
        validate_backend_for_device(backend, self.root_device)
        env = self.cluster_environment
        timeout = self._timeout
        # The ranks first meet with a start-up allowance, then the group gets the strategy's timeout:
        # a short timeout is for hangs in collectives, not for a rank still importing torch.
        startup = max(timeout or DEFAULT_STORE_TIMEOUT, STARTUP_TIMEOUT)
        store = next_group_store(env.main_address, env.main_port, is_rank_zero=self.global_rank == 0, timeout=startup)
        store.set_timeout(startup)
        wait_for_all_ranks(store, self.global_rank, self.world_size, startup)
        store.set_timeout(timeout or DEFAULT_STORE_TIMEOUT)
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        dist.init_process_group(backend, store=store, world_size=self.world_size, rank=self.global_rank, **kwargs)
        self._created_process_group = True
        self._store = store
        self._check_in_group = new_check_in_group() if self.world_size > 1 else None
        self._check_collectives = checking_enabled()

    @property
    def rendezvous_store(self) -> dist.Store | None:
        """The store the ranks met at (None when the process group was made by someone else)."""
        return self._store

    @property
    def created_process_group(self) -> bool:
        """Whether this strategy created the current default process group (and so destroys it)."""
        return self._created_process_group

    @property
    def supports_inference_mode(self) -> bool:
        """False on a gloo process group: tensors made under ``torch.inference_mode`` break its
        collectives, so evaluation uses ``torch.no_grad`` there (as in Lightning)."""
        return not (dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo")

    @property
    def keep_process_group_after_teardown(self) -> bool:
        """Whether :meth:`teardown` leaves the group alive until exit (sharded models need it)."""
        return False

    def _set_num_threads(self) -> None:
        """Share the CPU cores between the local processes unless the user chose (OMP_NUM_THREADS).

        Each process would otherwise start one intra-op thread per core, and N processes on C cores
        would fight over them; torchrun makes the same choice.
        """
        if "OMP_NUM_THREADS" in os.environ or self.num_processes <= 1:
            return
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // self.num_processes))

    # ------------------------------------------------------------------ model
    def model_to_device(self) -> None:
        """Move the model to :attr:`root_device`."""
        assert self.model is not None
        self.model.to(self.root_device)

    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Start every replica from rank 0's weights (SyncBatchNorm first, when asked and fitting).

        Subclasses that wrap (DDP) call ``super().wrap_model`` for evaluation runs and return their
        wrapper when training.
        """
        if training and self.sync_batchnorm:
            model = self.convert_sync_batchnorm(model)
        self.broadcast_module_states(model)
        return model

    def convert_sync_batchnorm(self, model: nn.Module) -> nn.Module:
        """Apply the layer sync: BatchNorm layers become SyncBatchNorm (statistics over all ranks; GPU
        only), or what a :class:`~phalanx.plugins.layer_sync.LayerSync` from ``plugins=`` does."""
        self._check_sync_batchnorm()
        return (self.layer_sync or TorchSyncBatchNorm()).apply(model)

    @staticmethod
    def broadcast_module_states(model: nn.Module) -> None:
        """Copy rank 0's parameters and buffers to every rank (what DDP's constructor does)."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)

    @contextmanager
    def _no_sync(self) -> Generator[None, None, None]:
        no_sync = getattr(self.model, "no_sync", None)
        if callable(no_sync):
            with no_sync():
                yield
        else:
            yield

    def block_backward_sync(self) -> Any:
        """Skip the gradient all-reduce for accumulation steps (DDP's ``no_sync``) when wrapped."""
        return self._no_sync()

    # ------------------------------------------------------------------ lifecycle
    def on_exception(self, exception: BaseException) -> None:
        """A collective timed out: add to the error which rank did not arrive and in what operation."""
        if is_collective_timeout(exception) and hasattr(exception, "add_note"):
            note = explain_timeout(
                exception, rank=self.global_rank, world_size=self.world_size, timeout=self._timeout,
                group=self._check_in_group,
            )
            if note:
                exception.add_note(f"phalanx: {note}")
        super().on_exception(exception)

    def teardown(self) -> None:
        """Release the process group this strategy created and reset the environment's state."""
        if self._created_process_group:
            self._created_process_group = False
            self._check_in_group = None
            self._store = None
            if self.keep_process_group_after_teardown:
                destroy_process_group_at_exit()
            elif dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        if self._cluster_environment is not None:
            self._cluster_environment.teardown()
        super().teardown()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(start_method={self._start_method!r}, "
            f"process_group_backend={self._process_group_backend!r}, precision_plugin={self.precision_plugin!r})"
        )


#: The keyword arguments of :class:`ParallelStrategy` (read from its signature), for subclasses
#: that forward ``**kwargs`` (see :func:`split_parallel_arguments`).
PARALLEL_ARGUMENTS: tuple[str, ...] = tuple(
    name for name in inspect.signature(ParallelStrategy.__init__).parameters if name != "self"
)
