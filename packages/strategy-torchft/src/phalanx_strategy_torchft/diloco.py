"""FTDiLoCoStrategy (``ft_diloco``): replica groups that train apart and meet every ``sync_every`` steps.

DiLoCo (Douillard et al., 2023) with torchft's fault tolerance. Each replica group is an ordinary
ddp job of its own (DDP inside the group, every step); the groups do not talk while they train.
Every ``sync_every`` optimizer steps of the Module's own optimizer (the *inner* steps), the groups
average their *pseudo-gradient* (the global weights of the last sync minus their local weights)
through torchft, and an *outer* optimizer (Nesterov SGD by default) steps the global weights with
it; every group continues from the result. Streaming DiLoCo (Douillard et al., 2025) splits the
weights into ``num_fragments`` fragments synchronised in turn, and may overlap a fragment's
all-reduce with ``fragment_sync_delay`` inner steps.

The algorithm is torchft's :class:`torchft.local_sgd.DiLoCo`, driven by hooks on the inner
optimizer; this class gives it phalanx's replica groups (the launcher, the lighthouse, restarts),
the fragments, the outer optimizers, the record of every sync and the checkpoint entry.

Failures follow torchft: a group that dies between syncs loses its own inner steps only; the
survivors' next sync waits about ``timeout`` for its heartbeat to stop, then commits without it.
A sync that fails (a group died during the all-reduce) is dropped everywhere: every group goes
back to the global weights of that fragment and trains on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from phalanx.errors import CheckpointError, MisconfigurationError
from phalanx.strategies.parallel import ParallelStrategy
from phalanx_strategy_torchft._groups import ENV_START
from phalanx_strategy_torchft.strategy import FTDDPStrategy

__all__ = ["FTDiLoCoStrategy", "check_diloco_state", "default_outer_optimizer", "split_fragments"]

#: An outer optimizer factory: called once per fragment with that fragment's parameters.
OuterOptimizerFactory = Callable[[list[nn.Parameter]], Optimizer]


def default_outer_optimizer(params: Iterable[nn.Parameter]) -> Optimizer:
    """The DiLoCo paper's outer optimizer: SGD with Nesterov momentum 0.9 and learning rate 0.7."""
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


def split_fragments(named: list[tuple[str, nn.Parameter]], num_fragments: int) -> list[list[tuple[str, nn.Parameter]]]:
    """Split the trainable parameters, in the Module's order, into ``num_fragments`` contiguous runs.

    A run closes once it reaches its share of the elements (``k/num_fragments`` of the total), or
    when exactly one parameter is left for each run still to come; no run is empty.
    """
    total = sum(p.numel() for _, p in named)
    runs: list[list[tuple[str, nn.Parameter]]] = [[]]
    done = 0
    for index, (name, param) in enumerate(named):
        runs[-1].append((name, param))
        done += param.numel()
        to_open = num_fragments - len(runs)
        left = len(named) - index - 1
        if to_open > 0 and (done * num_fragments >= total * len(runs) or left == to_open):
            runs.append([])
    return runs


def check_diloco_state(
    state: Mapping[str, Any],
    *,
    sync_every: int,
    num_fragments: int,
    fragments: list[list[str]],
    source: str = "the checkpoint",
) -> None:
    """Refuse DiLoCo state that this run cannot resume from.

    Raises:
        CheckpointError: It was saved with another ``sync_every`` or fragment split, or while a
            fragment's all-reduce was in flight (``fragment_sync_delay`` steps before a sync: its
            pseudo-gradient is not in a checkpoint).
    """
    saved = (state.get("sync_every"), state.get("num_fragments"), state.get("fragments"))
    if saved != (sync_every, num_fragments, fragments):
        msg = (
            f"{source} holds ft_diloco state for sync_every={saved[0]}, num_fragments={saved[1]} (fragments "
            f"{saved[2]}), but this run has sync_every={sync_every}, num_fragments={num_fragments} (fragments "
            f"{fragments}). Fix: resume with the options the checkpoint was saved with."
        )
        raise CheckpointError(msg)
    interval = sync_every // num_fragments
    local_step = int(state["local_step"])
    delay = int(state.get("fragment_sync_delay", 0))
    if delay and interval - delay <= local_step < interval:
        msg = (
            f"{source} was saved {local_step} inner steps after a sync, while a fragment's all-reduce was in flight "
            f"(fragment_sync_delay={delay}: steps {interval - delay}..{interval - 1} of each {interval}); its "
            "pseudo-gradient is not in a checkpoint. Fix: resume from a checkpoint saved at another step (e.g. "
            f"ModelCheckpoint(every_n_train_steps=...) a multiple of {interval})."
        )
        raise CheckpointError(msg)


def _check_int(name: str, value: Any, low: int, example: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        msg = f"FTDiLoCoStrategy({name}={value!r}) must be an integer >= {low}. Fix: e.g. {example}."
        raise MisconfigurationError(msg)
    return value


class FTDiLoCoStrategy(FTDDPStrategy):
    """Fault-tolerant DiLoCo with torchft: local training in each group, an outer step every ``sync_every``.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        sync_every: Inner optimizer steps between two syncs of the same fragment (torchft's
            ``sync_every``; torchtitan's ``sync_steps``). With fragments, one fragment syncs every
            ``sync_every // num_fragments`` steps, so it must be a multiple of ``num_fragments``.
        num_fragments: Streaming DiLoCo: the trainable parameters split into this many contiguous
            runs (in the Module's order, balanced by size), synchronised in turn; 1 is plain DiLoCo.
        fragment_sync_delay: Inner steps a fragment's all-reduce overlaps before the outer step
            waits for it (the streaming paper's tau); below ``sync_every // num_fragments``.
        fragment_update_alpha: How much of its local weights a group keeps when a fragment syncs:
            0 takes the new global weights (DiLoCo), 1 keeps the local ones; in between, a mix.
        outer_optimizer: Called once per fragment with that fragment's parameters, returns its
            outer optimizer; ``None``: :func:`default_outer_optimizer` (Nesterov SGD, lr 0.7,
            momentum 0.9, the DiLoCo paper's). A ``functools.partial`` of a torch optimizer works.
        **kwargs: :class:`FTDDPStrategy`'s options (``replica_groups``, ``min_replicas``,
            ``timeout``, ``quorum_timeout``, ``lighthouse``, ``max_restarts``,
            ``connect_timeout``) and ParallelStrategy's; the rest go to ``DistributedDataParallel``.

    Raises:
        MisconfigurationError: As :class:`FTDDPStrategy`; a ``sync_every`` that is not a positive
            multiple of ``num_fragments``, a ``fragment_sync_delay`` that does not fit before the
            next sync, an ``fragment_update_alpha`` outside [0, 1], an ``outer_optimizer`` that is
            not callable or does not return an optimizer, more fragments than trainable
            parameters, or a Module with several optimizers.
    """

    strategy_name: ClassVar[str] = "ft_diloco"

    def __init__(
        self,
        accelerator: Any = None,
        *,
        sync_every: int = 100,
        num_fragments: int = 1,
        fragment_sync_delay: int = 0,
        fragment_update_alpha: float = 0.0,
        outer_optimizer: OuterOptimizerFactory | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(accelerator, **kwargs)
        sync_every = _check_int("sync_every", sync_every, 1, "sync_every=100")
        num_fragments = _check_int("num_fragments", num_fragments, 1, "num_fragments=1")
        fragment_sync_delay = _check_int("fragment_sync_delay", fragment_sync_delay, 0, "fragment_sync_delay=0")
        if sync_every % num_fragments:
            low = sync_every - sync_every % num_fragments
            fix = f"sync_every={low} or {low + num_fragments}" if low else f"sync_every={num_fragments}"
            msg = (
                f"FTDiLoCoStrategy(sync_every={sync_every}) is not a multiple of num_fragments={num_fragments}: the "
                f"fragments sync in turn, one every sync_every // num_fragments inner steps. Fix: {fix}, or change "
                "num_fragments."
            )
            raise MisconfigurationError(msg)
        interval = sync_every // num_fragments
        if fragment_sync_delay >= interval:
            msg = (
                f"FTDiLoCoStrategy(fragment_sync_delay={fragment_sync_delay}) must be below sync_every // "
                f"num_fragments = {interval} (a fragment syncs every {interval} inner steps, and its all-reduce must "
                f"end before the next fragment's starts): valid values are 0..{interval - 1}. Fix: "
                f"fragment_sync_delay={interval - 1}, or raise sync_every."
            )
            raise MisconfigurationError(msg)
        if (
            isinstance(fragment_update_alpha, bool)
            or not isinstance(fragment_update_alpha, (int, float))
            or not (0.0 <= fragment_update_alpha <= 1.0)
        ):
            msg = (
                f"FTDiLoCoStrategy(fragment_update_alpha={fragment_update_alpha!r}) must be a number in [0, 1]: 0 takes "
                "the new global weights at a sync (DiLoCo), 1 keeps the local ones. Fix: fragment_update_alpha=0.0."
            )
            raise MisconfigurationError(msg)
        if outer_optimizer is not None and (isinstance(outer_optimizer, Optimizer) or not callable(outer_optimizer)):
            given = (
                f"a {type(outer_optimizer).__name__} instance"
                if isinstance(outer_optimizer, Optimizer)
                else repr(outer_optimizer)
            )
            msg = (
                f"FTDiLoCoStrategy(outer_optimizer=...) got {given}: it must be a callable that takes a fragment's "
                "parameters and returns a torch optimizer (one is built per fragment once the model is set up). "
                "Fix: e.g. outer_optimizer=functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True), "
                "or leave it None for that default."
            )
            raise MisconfigurationError(msg)
        self.sync_every = sync_every
        self.num_fragments = num_fragments
        self.fragment_sync_delay = fragment_sync_delay
        self.fragment_update_alpha = float(fragment_update_alpha)
        self.outer_optimizer_factory: OuterOptimizerFactory = outer_optimizer or default_outer_optimizer
        self.outer_optimizers: list[Optimizer] = []
        #: The parameter names of each fragment, in sync order (fragment ``k`` syncs at torchft steps ``k mod n``).
        self.fragments: list[list[str]] = []
        self._diloco: Any = None
        self._hooks: list[Any] = []
        self._inner_steps = 0  # inner steps since the last sync of any fragment (torchft's local step)
        self._step_started = 0.0
        self._ft_step_before = 0
        self._heals_before = 0

    @property
    def lighthouse_join_timeout(self) -> timedelta:
        """``quorum_timeout``: the groups ask for a quorum only at a sync, so a local run's lighthouse
        waits that long for a live group to reach it (a restarted group, a slower one) instead of
        syncing without it; a dead group stops counting once its heartbeat stops (``timeout``)."""
        return self.quorum_timeout

    @property
    def sync_interval(self) -> int:
        """Inner steps between two consecutive fragment syncs (``sync_every // num_fragments``)."""
        return self.sync_every // self.num_fragments

    # ------------------------------------------------------------------ model and manager
    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Fitting: create this group's torchft Manager; DDP inside the group averages every inner step.

        A group of one rank has nothing to average: its Module runs bare (DDP's reducer would only
        add its hooks and bucket copies to every step). ``init_sync`` is off: torchft would
        otherwise make every group but one heal at each quorum of torchft step 0, here the first
        sync, discarding their first ``sync_every`` inner steps (see :meth:`setup` for equal starts).
        """
        if not training:
            return super().wrap_model(model, training=False)
        self._manager = self._create_manager(init_sync=False)
        FTDDPStrategy._fits += 1
        if self.group_size == 1:
            return ParallelStrategy.wrap_model(self, model, training=True)
        device_ids = None if self.root_device.type == "cpu" else [self.root_device.index or 0]
        return DistributedDataParallel(model, device_ids=device_ids, **self._ddp_kwargs)

    def setup(self, trainer: Any) -> None:
        """Set up as ddp does, then hand the Module's optimizer and the fragments to torchft's DiLoCo.

        A local run's fresh start takes one quorum of every group before training (as ``ft_ddp``
        does), so the first sync waits for all of them, and every group takes the first group's
        weights. A group that starts late (a restart, or a group started apart) takes no quorum
        here: the others are between syncs and would wait for it in their next all-reduce. It
        trains its first ``sync_every // num_fragments`` steps, then heals at its first sync, as
        torchft's DiLoCo does.
        """
        self._trainer = trainer
        self.commit_log = []
        ParallelStrategy.setup(self, trainer)
        if self._manager is None:
            return
        if os.environ.get(ENV_START) is not None:
            self._meet_fresh_start()
            self._start_quorum()
            self._take_first_groups_weights()
        self._start_diloco()  # after: the global weights it keeps are the first group's

    def _take_first_groups_weights(self) -> None:
        """Every group starts from the quorum's first group's weights and buffers (whatever its seed).

        One torchft all-reduce (a sum) in which every other group contributes zeros: a broadcast
        through the fault-tolerant process group, so the groups need no other connection.
        """
        from torch.distributed import ReduceOp

        manager = self._manager
        first = manager.participating_rank() == 0
        tensors = [t for t in self.require_module().state_dict().values() if torch.is_floating_point(t)]
        with torch.no_grad():
            if not first:
                for tensor in tensors:
                    tensor.zero_()
            for work in [manager.allreduce(tensor, reduce_op=ReduceOp.SUM) for tensor in tensors]:
                work.wait()
        if manager.errored() is not None:
            msg = (
                f"Replica group {self.replica_group_id} could not take the first group's weights at the start: "
                f"{manager.errored()}. A group failed while the job started. Fix: start the job again."
            )
            raise RuntimeError(msg)

    def _start_diloco(self) -> None:
        from torchft.local_sgd import DiLoCo

        if len(self.optimizers) != 1:
            msg = (
                f"ft_diloco needs exactly one optimizer (the inner optimizer DiLoCo steps every batch), but "
                f"configure_optimizers returned {len(self.optimizers)}. Fix: return a single optimizer over all "
                "parameters, or train with ft_ddp."
            )
            raise MisconfigurationError(msg)
        named = [(name, p) for name, p in self.require_module().named_parameters() if p.requires_grad]
        if self.num_fragments > len(named):
            msg = (
                f"FTDiLoCoStrategy(num_fragments={self.num_fragments}) is more than the Module's {len(named)} "
                f"trainable parameters: every fragment needs at least one. Fix: num_fragments={len(named)} or fewer."
            )
            raise MisconfigurationError(msg)
        runs = split_fragments(named, self.num_fragments)
        self.fragments = [[name for name, _ in run] for run in runs]
        self.outer_optimizers = []
        for run in runs:
            outer = self.outer_optimizer_factory([p for _, p in run])
            if not isinstance(outer, Optimizer):
                msg = (
                    f"FTDiLoCoStrategy(outer_optimizer={self.outer_optimizer_factory!r}) returned "
                    f"{type(outer).__name__}, not a torch.optim.Optimizer. Fix: pass a callable that builds an "
                    "optimizer from the parameters it is given, e.g. functools.partial(torch.optim.SGD, lr=0.7)."
                )
                raise MisconfigurationError(msg)
            self.outer_optimizers.append(outer)
        inner = self.optimizers[0]
        self._diloco = DiLoCo(
            self._manager,
            [nn.ParameterList([p for _, p in run]) for run in runs],
            inner,
            self.outer_optimizers,
            sync_every=self.sync_every,
            fragment_sync_delay=self.fragment_sync_delay,
            fragment_update_alpha=self.fragment_update_alpha,
        )
        self._diloco.__enter__()
        self._inner_steps = 0
        # Registered after DiLoCo's: the post hook sees the sync that DiLoCo's hook has just run.
        self._hooks = [
            inner.register_step_pre_hook(self._before_inner_step),
            inner.register_step_post_hook(self._after_inner_step),
        ]

    # ------------------------------------------------------------------ the steps
    def optimizer_step(self, optimizer: Optimizer, closure: Any, model: nn.Module | None = None, **kwargs: Any) -> Any:
        """An inner step as ddp makes it (no quorum per step); DiLoCo's hooks on the optimizer sync."""
        return ParallelStrategy.optimizer_step(self, optimizer, closure, model, **kwargs)

    def _before_inner_step(self, *_: Any) -> None:
        self._step_started = time.monotonic()
        self._ft_step_before = self._manager.current_step()
        self._heals_before = len(self.heal_log)

    def _after_inner_step(self, *_: Any) -> None:
        """Record a sync in ``commit_log`` (the step DiLoCo's hook synced a fragment in)."""
        self._inner_steps += 1
        if self._inner_steps < self.sync_interval:
            return
        self._inner_steps = 0
        manager = self._manager
        loop = self._trainer.fit_loop if self._trainer is not None else None
        # torchft's step counts committed syncs (a heal in this step first set it to the source's).
        before = self.heal_log[-1]["ft_step"] if len(self.heal_log) > self._heals_before else self._ft_step_before
        ft_step = manager.current_step()
        committed = ft_step == before + 1
        fragment = before % self.num_fragments  # which fragment DiLoCo synced
        self.commit_log.append(
            {
                "global_step": loop.global_step if loop is not None else None,
                "epoch": loop.epoch if loop is not None else None,
                "batch_idx": loop.batches_done if loop is not None else None,
                "fragment": fragment,
                "committed": committed,
                "participants": manager.num_participants(),
                "ft_step": ft_step,
                "seconds": time.monotonic() - self._step_started,
            }
        )

    # ------------------------------------------------------------------ healing
    def _load_ft_state(self, state: dict[str, Any]) -> None:
        """As ft_ddp, except the loop position: a DiLoCo group heals mid-loop, at its first sync, and
        keeps its own position (its sampler goes on where it is)."""
        super()._load_ft_state(state)
        self._healed = None

    # ------------------------------------------------------------------ checkpoints
    def diloco_state(self) -> dict[str, Any]:
        """What resuming DiLoCo needs beside the Module's (local) weights and the inner optimizer.

        The global weights of the last sync of each fragment (torchft's ``original_parameters``,
        by parameter name), each fragment's outer optimizer state, the inner steps since the last
        sync, and torchft's step (which fragment syncs next).
        """
        diloco = self._require_diloco()
        originals: dict[str, torch.Tensor] = {}
        for names, fragment in zip(self.fragments, diloco._fragments):  # torchft keeps them per fragment
            for index, name in enumerate(names):
                originals[name] = fragment.original_parameters[str(index)].detach().clone()
        return {
            "sync_every": self.sync_every,
            "num_fragments": self.num_fragments,
            "fragment_sync_delay": self.fragment_sync_delay,
            "fragments": [list(names) for names in self.fragments],
            "original_parameters": originals,
            "outer_optimizers": [outer.state_dict() for outer in self.outer_optimizers],
            "local_step": diloco._local_step,
            "manager": dict(self._manager.state_dict()),
        }

    def load_diloco_state(self, state: Mapping[str, Any], source: str = "the checkpoint") -> None:
        """Restore :meth:`diloco_state` (the Module's weights and the inner optimizer are loaded apart).

        Raises:
            CheckpointError: The state was saved with other fragments, or while a fragment's
                all-reduce was in flight (its pseudo-gradient is not in a checkpoint).
        """
        diloco = self._require_diloco()
        check_diloco_state(
            state, sync_every=self.sync_every, num_fragments=self.num_fragments, fragments=self.fragments, source=source
        )
        local_step = int(state["local_step"])
        originals = state["original_parameters"]
        with torch.no_grad():
            for names, fragment in zip(self.fragments, diloco._fragments):
                for index, name in enumerate(names):
                    fragment.original_parameters[str(index)].copy_(originals[name])
        for outer, outer_state in zip(self.outer_optimizers, state["outer_optimizers"]):
            outer.load_state_dict(outer_state)
        diloco._local_step = local_step
        self._inner_steps = local_step % self.sync_interval
        self._manager.load_state_dict(state["manager"])

    def _require_diloco(self) -> Any:
        if self._diloco is None:
            msg = "ft_diloco's DiLoCo state exists only while fitting (after Trainer.fit has set the strategy up)."
            raise RuntimeError(msg)
        return self._diloco

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Add the DiLoCo state (``checkpoint["diloco"]``) to a training checkpoint, then write as ft_ddp does."""
        if self._diloco is not None and "optimizer_states" in checkpoint:
            checkpoint["diloco"] = self.diloco_state()
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Restore the inner optimizer, then the DiLoCo state; a checkpoint without one (e.g. of
        ft_ddp) starts DiLoCo afresh: the loaded weights become the global weights."""
        super().load_optimizer_state_dict(checkpoint)
        if self._diloco is None:
            return
        if "diloco" in checkpoint:
            self.load_diloco_state(checkpoint["diloco"])
            return
        params = dict(self.require_module().named_parameters())
        with torch.no_grad():
            for names, fragment in zip(self.fragments, self._diloco._fragments):
                for index, name in enumerate(names):
                    fragment.original_parameters[str(index)].copy_(params[name].detach())

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> None:
        """Take DiLoCo's and this strategy's hooks off the optimizer, then stop as ft_ddp does."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        diloco, self._diloco = self._diloco, None
        if diloco is not None:
            diloco.__exit__(None, None, None)
        super().teardown()

    def __repr__(self) -> str:
        return (
            f"FTDiLoCoStrategy(replica_groups={self.replica_groups}, sync_every={self.sync_every}, "
            f"num_fragments={self.num_fragments}, fragment_sync_delay={self.fragment_sync_delay}, "
            f"fragment_update_alpha={self.fragment_update_alpha}, outer_optimizer={self.outer_optimizer_factory!r}, "
            f"min_replicas={self.min_replicas}, lighthouse={self._lighthouse!r}, timeout={self.timeout})"
        )
