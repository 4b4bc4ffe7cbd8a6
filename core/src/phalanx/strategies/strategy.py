"""The Strategy base class: how a model, its optimizers and its data are spread over hardware.

The Trainer never touches devices, dtypes, wrappers or process groups directly; it calls the
strategy, which delegates dtype work to its Precision, device work to its Accelerator and storage
to its CheckpointIO. A new way of training (DDP, FSDP, DeepSpeed, XLA...) is therefore one
Strategy subclass in a plugin package, and the Trainer works with it unchanged.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Generator
from contextlib import ExitStack, contextmanager
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim import Optimizer

from phalanx._empty_init import SkipInit
from phalanx._module_hooks import BatchTransferHooks
from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies._checkpointing import StrategyCheckpointing
from phalanx.strategies._collectives import StrategyCollectives, TBroadcast
from phalanx.strategies._hooks import StrategyHooks
from phalanx.strategies._steps import StrategySteps
from phalanx.strategies.configuration import StrategyConfiguration
from phalanx.utilities.apply_func import move_data_to_device
from phalanx.utilities.compile import reapply_compile
from phalanx.utilities.model_helpers import is_overridden
from phalanx.utilities.optim import LRSchedulerConfig, init_optimizers_and_lr_schedulers, optimizers_to_device

__all__ = ["Strategy", "TBroadcast"]


class Strategy(StrategySteps, StrategyCollectives, StrategyCheckpointing, StrategyHooks, ABC):
    """Base class of every strategy; owns one Accelerator, one Precision and one CheckpointIO.

    Args:
        accelerator: The hardware; when ``None`` the Trainer's connector assigns one, and a
            strategy used on its own picks the built-in accelerator matching ``root_device``.
        checkpoint_io: Storage for checkpoints; ``TorchCheckpointIO()`` when ``None``.
        precision_plugin: Numeric format; ``Precision()`` ("32-true") when ``None``.
    """

    #: The registry name this class is registered under (e.g. ``"single_device"``).
    strategy_name: ClassVar[str] = ""

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        self._accelerator: Accelerator | None = None if accelerator is None else self.adapt_accelerator(accelerator)
        self._checkpoint_io: CheckpointIO | None = checkpoint_io
        self._precision_plugin: Precision | None = None
        self._precision_given = False
        if precision_plugin is not None:
            self.precision_plugin = precision_plugin
        self._launcher: Any = None
        self._model: nn.Module | None = None
        self._module: nn.Module | None = None
        self._optimizers: list[Optimizer] = []
        self.lr_scheduler_configs: list[LRSchedulerConfig] = []

    @property
    def accelerator(self) -> Accelerator | None:
        """The accelerator; ``None`` only until the Trainer (or :meth:`setup_environment`) sets it."""
        return self._accelerator

    @accelerator.setter
    def accelerator(self, accelerator: Accelerator | None) -> None:
        self._accelerator = None if accelerator is None else self.adapt_accelerator(accelerator)

    def adapt_accelerator(self, accelerator: Accelerator) -> Accelerator:
        """Check an accelerator before the strategy keeps it (given to the constructor or assigned).

        Override to refuse one the strategy cannot run on (raise ``MisconfigurationError`` naming
        the choices and the fix), as the XLA strategies refuse anything but XLA's. The default
        keeps it unchanged.
        """
        return accelerator

    @property
    def checkpoint_io(self) -> CheckpointIO:
        """How checkpoints are written and read; :meth:`default_checkpoint_io` when not given."""
        if self._checkpoint_io is None:
            self._checkpoint_io = self.default_checkpoint_io()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO | None) -> None:
        self._checkpoint_io = io

    @property
    def precision_plugin(self) -> Precision:
        """The precision; ``Precision()`` (32-true), adapted to this strategy, when none was given."""
        if self._precision_plugin is None:
            self._precision_plugin = self.adapt_precision_plugin(Precision())
        return self._precision_plugin

    @precision_plugin.setter
    def precision_plugin(self, precision_plugin: Precision | None) -> None:
        self._precision_plugin = None if precision_plugin is None else self.adapt_precision_plugin(precision_plugin)
        self._precision_given = precision_plugin is not None

    @property
    def has_precision_plugin(self) -> bool:
        """Whether a precision was given (to the constructor or assigned), rather than defaulted.

        The Trainer reads this to tell a strategy's own precision from ``Trainer(precision=...)``.
        """
        return self._precision_given

    def adapt_precision_plugin(self, precision_plugin: Precision) -> Precision:
        """Check or convert a precision before the strategy keeps it; returns what it will use.

        Called for every precision the strategy is given. Override to refuse a precision the
        strategy cannot run (raise ``MisconfigurationError`` naming the choices) or to turn it into
        the strategy's own kind (DeepSpeed and XLA do). The default keeps it unchanged.
        """
        return precision_plugin

    def default_checkpoint_io(self) -> CheckpointIO:
        """The CheckpointIO used when none is given: ``TorchCheckpointIO()``; override for another."""
        return TorchCheckpointIO()

    @property
    def launcher(self) -> Any:
        """Starts the other processes; ``None`` for strategies that run in the current process."""
        return self._launcher

    @property
    @abstractmethod
    def root_device(self) -> torch.device:
        """The device this process computes on."""

    @property
    @abstractmethod
    def is_global_zero(self) -> bool:
        """Whether this process is rank 0 across all nodes (the one that writes files and logs)."""

    @property
    def global_rank(self) -> int:
        """Rank of this process among all processes."""
        return 0

    @property
    def local_rank(self) -> int:
        """Rank of this process on its node."""
        return 0

    @property
    def node_rank(self) -> int:
        """Index of this process's node."""
        return 0

    @property
    def rendezvous_store(self) -> Any:
        """A key-value store every rank of the job reaches without the process group, or None.

        The hang watchdog sends its reports through it, because a hang means the process group is
        stuck. ParallelStrategy returns the store its ranks met at (a ``torch.distributed.Store``);
        a strategy whose ranks meet elsewhere may return its own, or None (each rank then prints
        its own report).
        """
        return None

    @property
    def device_mesh(self) -> Any:
        """The ``DeviceMesh`` the strategy lays ranks out on, or None (the Module sees it as ``self.device_mesh``)."""
        return None

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` and ``rank`` of this process's data shard, or None to read all data.

        The Trainer rebuilds each dataloader around a DistributedSampler with these arguments (unless
        ``Trainer(use_distributed_sampler=False)``). Strategies that shard data over only part of
        the world (model parallel) return that part's size and index.
        """
        return None

    @property
    def model(self) -> nn.Module | None:
        """The model as the strategy runs it, possibly wrapped (DDP, FSDP, ...)."""
        return self._model

    @model.setter
    def model(self, model: nn.Module | None) -> None:
        self._model = model

    @property
    def module(self) -> nn.Module | None:
        """The user's Module without any wrapper; what hooks, state dicts and logging use."""
        return self._module

    @property
    def lightning_module(self) -> nn.Module | None:
        """Lightning's name for :attr:`module`."""
        return self._module

    @property
    def optimizers(self) -> list[Optimizer]:
        """The optimizers created by :meth:`setup_optimizers` (possibly wrapped by the precision)."""
        return self._optimizers

    @optimizers.setter
    def optimizers(self, optimizers: list[Optimizer]) -> None:
        self._optimizers = list(optimizers)

    @property
    def handles_gradient_accumulation(self) -> bool:
        """Whether the strategy accumulates gradients itself (DeepSpeed does), not the loop."""
        return False

    @property
    def empty_init_on_meta(self) -> bool:
        """Whether ``tensor_init_context(empty_init=True)`` (``Trainer.init_module``) builds on the meta
        device: True for sharding strategies that allocate each shard and call ``reset_parameters``
        themselves when they set the model up; False here (weights are allocated, init is skipped)."""
        return False

    @property
    def supports_inference_mode(self) -> bool:
        """Whether evaluation may run under ``torch.inference_mode()`` (``Trainer(inference_mode=True)``);
        False makes it use ``torch.no_grad()`` (XLA graphs, for instance, cannot take inference tensors)."""
        return True

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Whether the strategy's checkpoint state exists only after :meth:`setup` (sharded models).

        phalanx always restores after setup; when this is True the Trainer also leaves checking a
        checkpoint against the model to the strategy (FSDP and DeepSpeed compare shard layouts).
        """
        return False

    @property
    def offload_module_on_teardown(self) -> bool:
        """Whether :meth:`teardown` moves the Module to CPU (sharded strategies return False: their
        shards live on devices the strategy manages, and gathering them to CPU would be costly)."""
        return True

    @property
    def restore_optimizer(self) -> bool:
        """Whether the Trainer restores optimizer/scheduler state (False: the strategy does it)."""
        return True

    @property
    def lightning_restore_optimizer(self) -> bool:
        """Lightning's name for :attr:`restore_optimizer`."""
        return self.restore_optimizer

    def configure(self, config: StrategyConfiguration) -> None:
        """Take what the Trainer resolved; called once per Trainer, before anything is launched.

        The base fills the accelerator (unless one was given), the precision and the checkpoint IO
        (when ``Trainer(plugins=...)`` holds one). Parallel strategies also take devices, nodes and
        the cluster environment and build their launcher here. Override to validate further, calling
        ``super().configure(config)`` first; raise ``MisconfigurationError`` naming the fix.
        """
        if self.accelerator is None:
            self.accelerator = config.accelerator
        self.precision_plugin = config.precision_plugin
        if config.checkpoint_io is not None:
            self.checkpoint_io = config.checkpoint_io

    def connect(self, model: nn.Module) -> None:
        """Remember the Module to train; it is also the model until :meth:`setup` wraps it."""
        self._module = model
        self._model = model

    def default_accelerator(self) -> Accelerator:
        """The accelerator used when none is given: the built-in one for :attr:`root_device`'s type."""
        from phalanx.accelerators import CPUAccelerator, CUDAAccelerator, MPSAccelerator

        choices: dict[str, type[Accelerator]] = {
            "cpu": CPUAccelerator,
            "cuda": CUDAAccelerator,
            "mps": MPSAccelerator,
        }
        device_type = self.root_device.type
        if device_type not in choices:
            msg = (
                f"{type(self).__name__} runs on a {device_type!r} device but has no accelerator, and "
                f"phalanx only infers one for {sorted(choices)}; pass accelerator=... explicitly."
            )
            raise MisconfigurationError(msg)
        return choices[device_type]()

    def require_accelerator(self) -> Accelerator:
        """The accelerator, choosing :meth:`default_accelerator` if none was set."""
        if self._accelerator is None:
            self._accelerator = self.default_accelerator()
        return self._accelerator

    def require_module(self) -> nn.Module:
        """The connected Module; raises a clear error before :meth:`connect` was called."""
        if self._module is None:
            msg = (
                f"{type(self).__name__} has no model yet; call strategy.connect(module) first "
                "(the Trainer does this in fit/validate/test/predict)."
            )
            raise MisconfigurationError(msg)
        return self._module

    def setup_environment(self) -> None:
        """Select this process's device before the model is built (parallel: process group too)."""
        self.require_accelerator().setup_device(self.root_device)

    def setup(self, trainer: Any) -> None:
        """Prepare everything for a run: accelerator, precision, device placement, wrapper, optimizers.

        A template: override :meth:`model_to_device` and :meth:`wrap_model` rather than this. Order
        matters: the model is converted, moved and wrapped before optimizers are created, so the
        optimizers reference the final parameters; optimizers are only built when fitting
        (``trainer.training``), since evaluation needs none.
        """
        self.require_accelerator().setup(trainer)
        self.require_module()
        assert self.model is not None
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        fitting = bool(trainer.training)
        self.model = self.wrap_model(self.model, training=fitting)
        name = self.strategy_name or type(self).__name__
        reapply_compile(self.require_module(), strategy_name=name, is_global_zero=self.is_global_zero)
        if fitting:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if fitting:
            optimizers_to_device(self.optimizers, self.root_device)

    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Return the model as this strategy runs it (e.g. inside DistributedDataParallel).

        Called by :meth:`setup` after the model is converted and moved, before the optimizers
        exist, with ``training=False`` for validate / test / predict. The default runs the model
        as it is. :attr:`module` stays the user's unwrapped Module whatever this returns.
        """
        del training
        return model

    def setup_optimizers(self, trainer: Any) -> None:
        """Create optimizers and scheduler configs from the Module's ``configure_optimizers``."""
        module = self.require_module()
        self.optimizers, self.lr_scheduler_configs = init_optimizers_and_lr_schedulers(module)

    def setup_precision_plugin(self) -> None:
        """Tell the precision the device, then let it wrap the model and optimizers."""
        self.precision_plugin.setup(self.root_device)
        assert self.model is not None
        model, optimizers = self.precision_plugin.connect(self.model, self.optimizers)
        self.model = model
        self.optimizers = optimizers

    @abstractmethod
    def model_to_device(self) -> None:
        """Move the model to :attr:`root_device`."""

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Move a batch to ``device`` (default :attr:`root_device`) and cast it for the precision.

        The Module's optional ``on_before_batch_transfer`` / ``transfer_batch_to_device`` /
        ``on_after_batch_transfer`` hooks run when it defines them, so custom batch types work.
        """
        target = device or self.root_device
        module = self._module
        if module is None or (_default_batch_hooks(type(module)) and not _hooks_on_instance(module)):  # type: ignore[arg-type]
            return self.precision_plugin.convert_input(move_data_to_device(batch, target))
        before = getattr(module, "on_before_batch_transfer", None)
        if callable(before):
            batch = before(batch, dataloader_idx)
        transfer = getattr(module, "transfer_batch_to_device", None)
        batch = transfer(batch, target, dataloader_idx) if callable(transfer) else move_data_to_device(batch, target)
        after = getattr(module, "on_after_batch_transfer", None)
        if callable(after):
            batch = after(batch, dataloader_idx)
        return self.precision_plugin.convert_input(batch)

    def process_dataloader(self, dataloader: Any) -> Any:
        """Wrap a dataloader if the strategy needs to (XLA's device loader); identity here."""
        return dataloader

    @contextmanager
    def model_sharded_context(self) -> Generator[None, None, None]:
        """Context for ``configure_model`` in which sharded strategies create layers already sharded."""
        yield

    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        """Create tensors directly on :attr:`root_device` in the precision's dtype.

        Args:
            empty_init: ``True`` skips ``torch.nn.init`` (weights are left uninitialised), for models
                whose weights a checkpoint overwrites anyway; a strategy that materialises meta
                tensors itself (:attr:`empty_init_on_meta`) builds on the meta device instead.
                ``None``/``False`` initialise normally.
        """
        with ExitStack() as stack:
            if empty_init and self.empty_init_on_meta:
                stack.enter_context(torch.device("meta"))
                stack.enter_context(self.precision_plugin.tensor_init_context())
                yield
                return
            if empty_init:
                stack.enter_context(SkipInit())
            stack.enter_context(self.root_device)
            stack.enter_context(self.precision_plugin.tensor_init_context())
            yield

    def teardown(self) -> None:
        """Release everything: optimizer state and the Module go back to CPU, parts are torn down.

        The Module is moved only when :attr:`offload_module_on_teardown` is True (the default), so
        a sharded strategy can leave its parameters where they are. The CheckpointIO is torn down
        last so that a failed background save surfaces after every other resource has been released.
        """
        optimizers_to_device(self.optimizers, torch.device("cpu"))
        module = self._module
        if module is not None and self.offload_module_on_teardown and self._runs_off_cpu():
            module.cpu()
        self.precision_plugin.teardown()
        if self._accelerator is not None:
            self._accelerator.teardown()
        self.checkpoint_io.teardown()

    def _runs_off_cpu(self) -> bool:
        try:
            return self.root_device.type != "cpu"
        except Exception:
            return False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(accelerator={self._accelerator!r}, "
            f"precision_plugin={self.precision_plugin!r}, checkpoint_io={self.checkpoint_io!r})"
        )


#: A hook set on an instance (not its class) also counts: ``_BATCH_HOOKS.isdisjoint(module.__dict__)``.
_BATCH_HOOKS = frozenset(("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"))


def _hooks_on_instance(module: nn.Module) -> bool:
    """Whether a batch-transfer hook was assigned on the instance (three look-ups, not a walk of its dict).

    The per-batch half of ``is_overridden`` for these three hooks: the class half is cached in
    :func:`_default_batch_hooks`, and this runs every batch, so it is written out for speed.
    """
    attributes = module.__dict__
    return (
        "on_before_batch_transfer" in attributes
        or "transfer_batch_to_device" in attributes
        or "on_after_batch_transfer" in attributes
    )


@functools.cache
def _default_batch_hooks(cls: type) -> bool:
    """Whether ``cls`` keeps the Module's three batch-transfer hooks (then one move does it all)."""
    return not any(is_overridden(name, cls, BatchTransferHooks) for name in _BATCH_HOOKS)
