"""DDPStrategy: PyTorch DistributedDataParallel, one process per device, on one or many nodes.

Each process holds a full replica of the model; DistributedDataParallel all-reduces (averages) the
gradients during backward, so every replica takes the same optimizer step. Launching, ranks, the
process group, data sharding and SyncBatchNorm come from the core's ParallelStrategy; what
``ddp``, ``ddp_spawn`` and ``ddp_fork`` differ in is only its ``start_method``. This class adds
the wrapper and DDP's communication hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from phalanx.accelerators.accelerator import Accelerator
from phalanx.strategies.parallel import ParallelStrategy, split_parallel_arguments

__all__ = ["DDPStrategy"]


class DDPStrategy(ParallelStrategy):
    """Data-parallel training with ``torch.nn.parallel.DistributedDataParallel``.

    Args:
        accelerator: See :class:`~phalanx.strategies.strategy.Strategy`.
        ddp_comm_state: State object passed to ``ddp_comm_hook``.
        ddp_comm_hook: A DDP communication hook (e.g. ``default_hooks.fp16_compress_hook``),
            registered right after wrapping.
        ddp_comm_wrapper: Wraps ``ddp_comm_hook`` (e.g. ``default_hooks.fp16_compress_wrapper``).
        **kwargs: Every :class:`~phalanx.strategies.parallel.ParallelStrategy` argument
            (``parallel_devices``, ``cluster_environment``, ``checkpoint_io``, ``precision_plugin``,
            ``process_group_backend``, ``timeout``, ``start_method``, ``sync_batchnorm``); the rest
            go to ``DistributedDataParallel``: ``find_unused_parameters``, ``static_graph``,
            ``gradient_as_bucket_view``, ``bucket_cap_mb``, ...
    """

    #: DDP's gradient sync runs in the wrapper's hooks: the Trainer may take the direct step.
    passes_step_through = True

    strategy_name: ClassVar[str] = "ddp"
    #: DistributedDataParallel's constructor imports torch._dynamo on first use (seconds of work);
    #: imported once before forking, every forked worker starts with it.
    launcher_preload = ("torch._dynamo",)

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        *,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> None:
        parallel, ddp_kwargs = split_parallel_arguments(
            kwargs, owner=type(self), forward_to=DistributedDataParallel.__init__, supplied=("module", "device_ids")
        )
        super().__init__(accelerator, **parallel)
        self._ddp_comm_state = ddp_comm_state
        self._ddp_comm_hook = ddp_comm_hook
        self._ddp_comm_wrapper = ddp_comm_wrapper
        self._comm_hooks: list[tuple[Callable[..., Any], object | None]] = []
        self._ddp_kwargs = ddp_kwargs

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """Keyword arguments passed to ``DistributedDataParallel``."""
        return self._ddp_kwargs

    # ------------------------------------------------------------------ wrapping
    def wrap_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Wrap in DistributedDataParallel when fitting; evaluation runs unwrapped on rank 0's weights.

        DDP wraps before the optimizers are created so that a :meth:`configure_ddp` override may
        replace parameters; evaluation needs no gradient reduction, so the base class only
        broadcasts rank 0's weights and every rank evaluates the same model.
        """
        if not training:
            return super().wrap_model(model, training=False)
        if self.sync_batchnorm:
            model = self.convert_sync_batchnorm(model)
        self.model = model
        self.configure_ddp()
        assert self.model is not None
        return self.model

    def determine_ddp_device_ids(self) -> list[int] | None:
        """``device_ids`` for DistributedDataParallel: None on CPU, ``[index]`` on a GPU."""
        if self.root_device.type == "cpu":
            return None
        return [self.root_device.index if self.root_device.index is not None else 0]

    def configure_ddp(self) -> None:
        """Wrap :attr:`model` for DDP; override to use your own wrapper (Lightning's hook name)."""
        assert self.model is not None
        self.model = DistributedDataParallel(
            module=self.model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs
        )
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

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> None:
        """Unwrap the model, then release the process group and the parts."""
        if isinstance(self.model, DistributedDataParallel):
            self.model = self.module
        super().teardown()

    def __repr__(self) -> str:
        return (
            f"DDPStrategy(start_method={self.start_method!r}, process_group_backend="
            f"{self.requested_process_group_backend!r}, ddp_kwargs={self._ddp_kwargs!r})"
        )
