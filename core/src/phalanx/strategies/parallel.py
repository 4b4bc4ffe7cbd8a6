"""ParallelStrategy: the base of every strategy that runs one process per device.

It adds what all multi-process strategies share: ranks from a ClusterEnvironment, the process
group, collectives over ``torch.distributed`` that degrade to identities before the group exists,
gradient-sync blocking for accumulation, and DistributedSampler injection. DDP, FSDP and DeepSpeed
plugins subclass it and add only their wrapper.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies._collectives import TBroadcast
from phalanx.strategies._distributed import all_gather as _all_gather
from phalanx.strategies._distributed import inject_distributed_sampler, resolve_reduce_op
from phalanx.strategies._rendezvous import next_group_store
from phalanx.strategies.strategy import Strategy

__all__ = ["ParallelStrategy"]


class ParallelStrategy(Strategy):
    """A strategy with one process per device, on one or several nodes.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        parallel_devices: One device per local process (the Trainer's connector fills it from
            ``devices``); local rank ``i`` computes on ``parallel_devices[i]``.
        cluster_environment: Where ranks and the rendezvous come from; detected on first use
            (torchrun, SLURM, else the local machine) when ``None``.
        checkpoint_io: See :class:`~phalanx.strategies.strategy.Strategy`.
        precision_plugin: See :class:`~phalanx.strategies.strategy.Strategy`.
    """

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        super().__init__(accelerator, checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self._parallel_devices = list(parallel_devices) if parallel_devices is not None else None
        self._cluster_environment = cluster_environment
        self._num_nodes = 1
        self._created_process_group = False

    # ------------------------------------------------------------------ configuration
    @property
    def cluster_environment(self) -> ClusterEnvironment:
        """The cluster environment; detected through the plugins the first time it is needed."""
        if self._cluster_environment is None:
            from phalanx.plugins import detect_cluster_environment

            self._cluster_environment = detect_cluster_environment()
        return self._cluster_environment

    @cluster_environment.setter
    def cluster_environment(self, environment: ClusterEnvironment | None) -> None:
        self._cluster_environment = environment
        self._on_configuration_change()

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
        self._on_configuration_change()

    @property
    def num_nodes(self) -> int:
        """Number of nodes (machines); set by the Trainer's connector from ``num_nodes``."""
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = int(num_nodes)
        self._on_configuration_change()

    @property
    def num_processes(self) -> int:
        """Processes per node: one per parallel device."""
        return len(self._parallel_devices) if self._parallel_devices is not None else 0

    def _on_configuration_change(self) -> None:
        """Hook for subclasses whose launcher depends on devices / nodes / environment."""

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
        """Tell the environment this process's global rank and the world size (from devices x nodes)."""
        env = self.cluster_environment
        env.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
        env.set_world_size(self.num_nodes * self.num_processes)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """``num_replicas`` and ``rank`` for a DistributedSampler: each rank reads its own shard."""
        replicas = self.num_nodes * self.num_processes if self.num_processes else self.world_size
        return {"num_replicas": replicas, "rank": self.global_rank}

    # ------------------------------------------------------------------ process group
    def _init_process_group(self, backend: str, timeout: timedelta | None = None) -> None:
        """Create the default process group unless one exists (then it is someone else's to destroy).

        The rendezvous address comes from the cluster environment, through a store kept for the
        whole process (see :mod:`phalanx.strategies._rendezvous`), so phalanx never writes
        ``MASTER_ADDR`` / ``MASTER_PORT`` into this process's environment and a second entry point
        can safely create a new group.
        """
        if dist.is_initialized():
            return
        env = self.cluster_environment
        store = next_group_store(env.main_address, env.main_port, is_rank_zero=self.global_rank == 0, timeout=timeout)
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        dist.init_process_group(backend, store=store, world_size=self.world_size, rank=self.global_rank, **kwargs)
        self._created_process_group = True

    def _destroy_process_group(self) -> None:
        """Destroy the group this strategy created (a group the user created is left alone)."""
        if self._created_process_group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        self._created_process_group = False

    @staticmethod
    def _set_num_threads_if_needed(num_processes: int) -> None:
        """Share the CPU cores between the local processes unless the user chose (OMP_NUM_THREADS).

        Each process would otherwise start one intra-op thread per core, and N processes on C cores
        would fight over them; torchrun makes the same choice.
        """
        if "OMP_NUM_THREADS" in os.environ or num_processes <= 1:
            return
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // num_processes))

    # ------------------------------------------------------------------ collectives
    def all_gather(self, tensor: torch.Tensor, group: Any | None = None, sync_grads: bool = False) -> torch.Tensor:
        """Gather ``tensor`` from every rank into a tensor of shape ``(world_size, *tensor.shape)``.

        ``sync_grads=True`` uses the differentiable all_gather, so gradients flow back to every
        rank's input (contrastive losses need this).
        """
        if not (dist.is_available() and dist.is_initialized()):
            return tensor
        return _all_gather(tensor, dist.group.WORLD if group is None else group, sync_grads=sync_grads)

    def reduce(
        self, tensor: torch.Tensor | Any, group: Any | None = None, reduce_op: Any | None = "mean"
    ) -> torch.Tensor | Any:
        """Reduce a tensor over ranks: "mean" (default), "sum", "max", "min" or a ``ReduceOp``.

        Returns a new tensor (the input is left untouched). Non-tensors pass through unchanged, so
        callers can reduce logged values without checking their type.
        """
        if not isinstance(tensor, torch.Tensor) or not (dist.is_available() and dist.is_initialized()):
            return tensor
        group = dist.group.WORLD if group is None else group
        op, divide = resolve_reduce_op(reduce_op)
        result = tensor.detach().clone()
        if divide and not torch.is_floating_point(result):
            result = result.float()
        dist.all_reduce(result, op=op, group=group)
        if divide:
            result = result / dist.get_world_size(group)
        return result

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Agree on a boolean: every rank (``all=True``) or at least one rank said yes."""
        if not (dist.is_available() and dist.is_initialized()):
            return bool(decision)
        return super().reduce_boolean_decision(decision, all=all)

    def barrier(self, name: str | None = None) -> None:
        """Block until every rank arrives; a no-op before the process group exists."""
        del name
        if not (dist.is_available() and dist.is_initialized()):
            return
        if dist.get_backend() == "nccl" and self.root_device.type == "cuda":
            dist.barrier(device_ids=[self.root_device.index])
        else:
            dist.barrier()

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Send any picklable object from rank ``src`` to every rank."""
        if not (dist.is_available() and dist.is_initialized()):
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

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

    # ------------------------------------------------------------------ data
    def _inject_distributed_sampler(self, dataloader: Any, shuffle: bool | None = None) -> Any:
        """Return ``dataloader`` rebuilt with a DistributedSampler for this rank, settings preserved.

        Args:
            dataloader: A ``torch.utils.data.DataLoader``; anything else (or an iterable-style
                dataset, or one that already has a DistributedSampler) is returned unchanged.
            shuffle: Whether the sampler shuffles; ``None`` keeps what the dataloader did (a
                RandomSampler means shuffle).
        """
        return inject_distributed_sampler(dataloader, shuffle, **self.distributed_sampler_kwargs)

    # ------------------------------------------------------------------ lifecycle
    def teardown(self) -> None:
        """Release the process group this strategy created and reset the environment's state."""
        self._destroy_process_group()
        if self._cluster_environment is not None:
            self._cluster_environment.teardown()
        super().teardown()
