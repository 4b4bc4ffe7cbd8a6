"""FTDDPStrategy (``ft_ddp``): replica groups that fail and heal without restarting the job.

The job is ``replica_groups`` groups of ``devices x num_nodes`` ranks. Inside a group, ranks are
an ordinary phalanx ddp job (the core's ParallelStrategy launches and joins them); across groups,
gradients are averaged by torchft, whose lighthouse decides before every step which groups take
part (the quorum). A group that dies is dropped after ``timeout``; the others go on alone. A group
that (re)starts while the others run receives their state from a live peer before its first step
(weights, optimizer and scheduler state, the step counter and the loop position, hence the
sampler position) and rejoins. See docs/torchft.md for which steps commit.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any, ClassVar

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from phalanx.accelerators.accelerator import Accelerator
from phalanx.errors import MisconfigurationError
from phalanx.launchers.launcher import Launcher
from phalanx.strategies.configuration import StrategyConfiguration
from phalanx.strategies.parallel import ParallelStrategy, split_parallel_arguments
from phalanx_strategy_torchft._groups import ENV_GROUP, ENV_LIGHTHOUSE, ENV_START, GroupsConfig, ReplicaGroupsLauncher
from phalanx_strategy_torchft._local_lighthouse import check_reachable, parse_address
from phalanx_strategy_torchft._manager import CommitGate, clone_state, ft_comm_hook, state_size

__all__ = ["FTDDPStrategy"]

_STARTUP_SECONDS = 300.0


def _seconds(name: str, value: timedelta | float | int) -> timedelta:
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = timedelta(seconds=value)
    else:
        msg = (
            f"FTDDPStrategy({name}={value!r}) must be a datetime.timedelta or a number of seconds. Fix: e.g. {name}=30."
        )
        raise MisconfigurationError(msg)
    if result.total_seconds() <= 0:
        msg = f"FTDDPStrategy({name}={value!r}) must be positive. Fix: e.g. {name}=timedelta(seconds=30)."
        raise MisconfigurationError(msg)
    return result


class FTDDPStrategy(ParallelStrategy):
    """Fault-tolerant data parallel with torchft: DDP inside each replica group, torchft across.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        replica_groups: Number of replica groups in the job. A local run starts them all; on a
            cluster each group is its own job (see ``replica_group_id``).
        replica_group_id: This process's group. ``None``: read ``PHALANX_FT_REPLICA_GROUP``; when
            that is unset too, this is a local run that launches every group (this process is
            group 0).
        min_replicas: Groups a step needs to commit (and the lighthouse's quorum minimum).
        quorum_timeout: How long a group waits for a quorum (a restarted group waits for the
            others' next step; keep it above the step time).
        timeout: How long a collective across groups waits for a dead peer before the step is
            dropped (also the lighthouse's heartbeat timeout for a local run); default 30 s.
        lighthouse: ``"http://HOST:PORT"`` of a running lighthouse; ``None`` reads
            ``TORCHFT_LIGHTHOUSE`` and, when unset on a local run, starts one.
        max_restarts: How often a local run restarts a group that died (0: never).
        connect_timeout: How long to try reaching the lighthouse and the other groups' managers.
        **kwargs: ParallelStrategy's arguments; the rest go to ``DistributedDataParallel``.

    Raises:
        MisconfigurationError: ``min_replicas`` above ``replica_groups``, a bad group id or
            timeout, or (at ``Trainer(...)``) a lighthouse address nothing listens at.
    """

    strategy_name: ClassVar[str] = "ft_ddp"
    #: Where the keywords that are neither this class's nor ParallelStrategy's go, and what the
    #: strategy passes there itself (checked at construction: a misspelt one fails there).
    forwards_options_to: ClassVar[tuple[Any, tuple[str, ...]]] = (
        DistributedDataParallel.__init__,
        ("module", "device_ids"),
    )
    #: Groups are re-runs of the script: state cannot be pickled to spawned workers.
    supported_start_methods = ("popen",)
    launcher_preload = ("torch._dynamo",)
    #: Fits set up in this process so far (every group runs the same script, so the counts agree).
    _fits: ClassVar[int] = 0

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        replica_groups: int = 2,
        replica_group_id: int | None = None,
        min_replicas: int = 1,
        quorum_timeout: timedelta | float = 60.0,
        lighthouse: str | None = None,
        max_restarts: int = 3,
        connect_timeout: timedelta | float = 10.0,
        **kwargs: Any,
    ) -> None:
        target, supplied = self.forwards_options_to
        parallel, ddp_kwargs = split_parallel_arguments(kwargs, owner=type(self), forward_to=target, supplied=supplied)
        parallel["timeout"] = _seconds("timeout", parallel.get("timeout") or 30.0)
        super().__init__(accelerator, **parallel)
        for name, value, low in (
            ("replica_groups", replica_groups, 1),
            ("min_replicas", min_replicas, 1),
            ("max_restarts", max_restarts, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                msg = f"{type(self).__name__}({name}={value!r}) must be an integer >= {low}. Fix: e.g. {name}={max(low, 1)}."
                raise MisconfigurationError(msg)
        if min_replicas > replica_groups:
            msg = (
                f"{type(self).__name__}(min_replicas={min_replicas}) needs at least {min_replicas} replica groups but "
                f"replica_groups={replica_groups}: no step could ever commit. Fix: lower min_replicas to at most "
                f"{replica_groups}, or raise replica_groups to {min_replicas} or more."
            )
            raise MisconfigurationError(msg)
        if replica_group_id is not None and not 0 <= replica_group_id < replica_groups:
            msg = (
                f"{type(self).__name__}(replica_group_id={replica_group_id!r}) is not a group of this job: valid ids are "
                f"0..{replica_groups - 1} (replica_groups={replica_groups}). Fix: pass an id in that range."
            )
            raise MisconfigurationError(msg)
        if lighthouse is not None:
            parse_address(lighthouse)
        self.replica_groups = replica_groups
        self._replica_group_id = replica_group_id
        self.min_replicas = min_replicas
        self.quorum_timeout = _seconds("quorum_timeout", quorum_timeout)
        self.connect_timeout = _seconds("connect_timeout", connect_timeout)
        self.max_restarts = max_restarts
        self._lighthouse = lighthouse
        self._ddp_kwargs = ddp_kwargs
        self._manager: Any = None
        self._ft_store: Any = None  # the torchft Manager's store (rank 0 hosts it)
        self._trainer: Any = None
        self._quorum_ready = False
        self._healed: dict[str, Any] | None = None
        self.commit_log: list[dict[str, Any]] = []
        self.heal_log: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ the job's layout
    @property
    def launches_groups(self) -> bool:
        """Whether this process starts the other groups (a local run's top process)."""
        return self._replica_group_id is None and os.environ.get(ENV_GROUP) is None

    @property
    def replica_group_id(self) -> int:
        """This process's replica group (0 in a local run's top process)."""
        if self._replica_group_id is not None:
            return self._replica_group_id
        value = os.environ.get(ENV_GROUP, "0")
        try:
            group = int(value)
        except ValueError:
            group = -1
        if not 0 <= group < self.replica_groups:
            msg = f"{ENV_GROUP}={value!r} is not a group of this job (0..{self.replica_groups - 1}). Fix: set it in range."
            raise MisconfigurationError(msg)
        return group

    @property
    def lighthouse(self) -> str | None:
        """The lighthouse address: given, from the launcher, from ``TORCHFT_LIGHTHOUSE``, else None."""
        return self._lighthouse or os.environ.get(ENV_LIGHTHOUSE) or os.environ.get("TORCHFT_LIGHTHOUSE")

    @property
    def group_size(self) -> int:
        """Ranks per replica group (devices x nodes)."""
        return max(self.num_processes, 1) * self.num_nodes

    @property
    def replica_rank(self) -> int:
        """This rank's index among all ranks of all groups (what the data is sharded by)."""
        return self.replica_group_id * self.group_size + self.global_rank

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """Every rank of every group reads its own shard, as plain DDP over all of them would."""
        return {"num_replicas": self.replica_groups * self.group_size, "rank": self.replica_rank}

    @property
    def is_global_zero(self) -> bool:
        """Rank 0 of the first group in the current quorum: exactly one survivor writes checkpoints."""
        if self.global_rank != 0:
            return False
        manager = self._manager
        if manager is not None and manager.participating_rank() is not None:
            return bool(manager.participating_rank() == 0)
        return self.replica_group_id == 0

    # ------------------------------------------------------------------ configuration
    def configure(self, config: StrategyConfiguration) -> None:
        """Resolve the group and check a given lighthouse now, at ``Trainer(...)``, before anything starts."""
        self.replica_group_id  # noqa: B018 - validates PHALANX_FT_REPLICA_GROUP
        given = self._lighthouse or os.environ.get("TORCHFT_LIGHTHOUSE")
        if given is not None:
            check_reachable(given, self.connect_timeout)
        super().configure(config)

    def _require_lighthouse(self) -> str:
        address = self.lighthouse
        if address is None:
            msg = (
                f"Replica group {self.replica_group_id} has no lighthouse address: a group started on its own "
                "(replica_group_id or PHALANX_FT_REPLICA_GROUP set) must join the job's lighthouse. Fix: pass "
                "lighthouse='http://HOST:PORT' or set TORCHFT_LIGHTHOUSE."
            )
            raise MisconfigurationError(msg)
        return address

    def create_launcher(self) -> Launcher | None:
        """This group's ranks as ddp launches them; in a local run's top process, all groups first."""
        inner = super().create_launcher()
        if not self.launches_groups or inner is None:
            return inner
        timeout = self.timeout or timedelta(seconds=30)
        groups = GroupsConfig(
            num_groups=self.replica_groups,
            min_replicas=self.min_replicas,
            lighthouse=self.lighthouse,
            timeout=timeout,
            max_restarts=self.max_restarts,
            finish_timeout=(self.quorum_timeout + 2 * timeout).total_seconds() + 30.0,
            join_timeout=self.lighthouse_join_timeout,
        )
        return ReplicaGroupsLauncher(inner, groups)

    @property
    def lighthouse_join_timeout(self) -> timedelta | None:
        """How long a local run's lighthouse waits for a live group that has not asked for the quorum
        yet (None: ``timeout``; every group asks at every step, so they arrive together)."""
        return None

    # ------------------------------------------------------------------ model and manager
    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Fitting: create this group's torchft Manager and wrap in DDP with the fault-tolerant hook."""
        if not training:
            return super().wrap_model(model, training=False)
        self._manager = self._create_manager()
        FTDDPStrategy._fits += 1
        kwargs = {"find_unused_parameters": True, **self._ddp_kwargs}  # buckets never rebuilt: peers heal into them
        device_ids = None if self.root_device.type == "cpu" else [self.root_device.index or 0]
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **kwargs)
        wrapped.register_comm_hook((self._manager, self.group_size), ft_comm_hook)
        return wrapped

    def _create_manager(self, *, init_sync: bool = True) -> Any:
        """This group's torchft Manager. ``init_sync``: whether a quorum at torchft step 0 makes every
        group but the first heal from it (torchft's option; ft_diloco turns it off, see its docstring)."""
        from torchft import Manager
        from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

        host = self.cluster_environment.main_address
        port = [0]
        if self.global_rank == 0:
            self._ft_store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
            port[0] = self._ft_store.port
        if self.group_size > 1:
            dist.broadcast_object_list(port, src=0)
        timeout = self.timeout or timedelta(seconds=30)
        pg = ProcessGroupNCCL(timeout=timeout) if self.root_device.type == "cuda" else ProcessGroupGloo(timeout=timeout)
        return Manager(
            pg=pg,
            load_state_dict=self._load_ft_state,
            state_dict=self._ft_state,
            min_replica_size=self.min_replicas,
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=self.quorum_timeout,
            connect_timeout=self.connect_timeout,
            rank=self.global_rank,
            world_size=self.group_size,
            store_addr=host,
            store_port=port[0],
            lighthouse_addr=self._require_lighthouse(),
            replica_id=f"phalanx_ft_group_{self.replica_group_id}",
            hostname=socket.gethostname(),
            init_sync=init_sync,
        )

    def setup(self, trainer: Any) -> None:
        """Set up as ddp does, then take this step's quorum now: a late group heals before its loop starts."""
        self._trainer = trainer
        self.commit_log = []
        super().setup(trainer)
        if self._manager is None:
            return
        self._meet_fresh_start()
        self._start_quorum()
        self._quorum_ready = True
        if self._healed is not None:
            loop = self._healed.get("loop")
            if loop is not None:
                trainer.fit_loop.load_state_dict(loop, None)
            self._healed = None

    def _meet_fresh_start(self) -> None:
        """A fresh local start: every group's rank 0 meets here, so the first quorum holds them all."""
        address = os.environ.get(ENV_START)
        if address is None or self.global_rank != 0:
            return
        host, _, port = address.rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=_STARTUP_SECONDS))
        key = f"ready-{self._fits}"  # every fit of the script meets anew
        store.add(key, 1)
        deadline = time.monotonic() + _STARTUP_SECONDS
        while store.add(key, 0) < self.replica_groups:
            if time.monotonic() > deadline:
                msg = f"Only {store.add(key, 0)} of {self.replica_groups} replica groups started within {_STARTUP_SECONDS:.0f} s."
                raise RuntimeError(msg)
            time.sleep(0.05)
        time.sleep(0.5)  # the managers' heartbeats reach the lighthouse: it then waits for all of them

    def _start_quorum(self) -> None:
        try:
            self._manager.start_quorum()
        except Exception as err:
            msg = (
                f"Replica group {self.replica_group_id} could not get a quorum from the torchft lighthouse at "
                f"{self.lighthouse!r} within quorum_timeout={self.quorum_timeout.total_seconds():g}s: {err}. "
                "The lighthouse must run for the whole job. Fix: restart the lighthouse and the job (resume "
                "from the last checkpoint with ckpt_path='last'), or check the address."
            )
            raise RuntimeError(msg) from err

    # ------------------------------------------------------------------ the state a healing peer receives
    def _ft_state(self) -> dict[str, Any]:
        trainer = self._trainer
        state = {
            "model": self.require_module().state_dict(),
            "optimizers": [opt.state_dict() for opt in self.optimizers],
            "schedulers": [config.scheduler.state_dict() for config in self.lr_scheduler_configs],
            "loop": trainer.fit_loop.state_dict() if trainer is not None else None,
        }
        return clone_state(state)

    def _load_ft_state(self, state: dict[str, Any]) -> None:
        started = time.monotonic()
        self.require_module().load_state_dict(state["model"])
        for optimizer, optimizer_state in zip(self.optimizers, state["optimizers"]):
            optimizer.load_state_dict(optimizer_state)
        for config, scheduler_state in zip(self.lr_scheduler_configs, state["schedulers"]):
            config.scheduler.load_state_dict(scheduler_state)
        self._healed = state
        loop = state.get("loop") or {}
        self.heal_log.append(
            {
                "ft_step": self._manager.current_step() if self._manager is not None else None,
                "global_step": loop.get("global_step"),
                "epoch": loop.get("epoch"),
                "batches_done": loop.get("batches_done"),
                "bytes": state_size([state["model"], state["optimizers"]]),
                "load_seconds": time.monotonic() - started,
            }
        )

    # ------------------------------------------------------------------ the step
    def optimizer_step(self, optimizer: Optimizer, closure: Any, model: nn.Module | None = None, **kwargs: Any) -> Any:
        """Quorum, forward + backward (reduced across the quorum), then step only if the step commits."""
        manager = self._manager
        if manager is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        started = time.monotonic()
        if self._quorum_ready:
            self._quorum_ready = False
        else:
            self._start_quorum()
        gate = CommitGate(optimizer, manager.should_commit)
        result = super().optimizer_step(gate, closure, model, **kwargs)
        loop = self._trainer.fit_loop if self._trainer is not None else None
        self.commit_log.append(
            {
                "global_step": loop.global_step if loop is not None else None,
                "epoch": loop.epoch if loop is not None else None,
                "batch_idx": loop.batches_done if loop is not None else None,
                "committed": gate.committed,
                "participants": manager.num_participants(),
                "ft_step": manager.current_step(),
                "seconds": time.monotonic() - started,
            }
        )
        return result

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> None:
        """Stop the Manager (its server, heartbeats and checkpoint server), then release as ddp does."""
        if isinstance(self.model, DistributedDataParallel):
            self.model = self.module
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.shutdown(wait=False)
        self._ft_store = None
        self._quorum_ready = False
        super().teardown()

    def __repr__(self) -> str:
        return (
            f"FTDDPStrategy(replica_groups={self.replica_groups}, min_replicas={self.min_replicas}, "
            f"lighthouse={self._lighthouse!r}, timeout={self.timeout}, quorum_timeout={self.quorum_timeout})"
        )
