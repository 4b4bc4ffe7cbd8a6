"""What every XLA strategy shares: its parts must be XLA parts, data goes through MpDeviceLoader,
and each optimizer step ends the lazily traced graph.

torch-xla records operations instead of running them; nothing executes until the graph is cut
(``torch_xla.sync()``, formerly ``xm.mark_step()``). Cutting once per optimizer step gives one
compiled graph per training step, reused every step, which is how torch-xla is meant to be driven.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim import Optimizer

from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO, PathLike
from phalanx.errors import MisconfigurationError, PhalanxError
from phalanx.precision.precision import Precision
from phalanx_strategy_xla import _runtime
from phalanx_strategy_xla.precision import to_xla_precision

__all__ = ["XLAStrategyMixin", "check_accelerator", "wrap_dataloader"]


def check_accelerator(strategy: str, accelerator: Accelerator | None) -> None:
    """Refuse a non-XLA accelerator for an XLA strategy, naming the fix.

    Raises:
        MisconfigurationError: ``accelerator`` is not the XLA accelerator.
    """
    from phalanx_strategy_xla.accelerator import XLAAccelerator

    if accelerator is None or isinstance(accelerator, XLAAccelerator):
        return
    name = getattr(accelerator, "name", "") or type(accelerator).__name__
    msg = (
        f"strategy={strategy!r} runs on XLA devices, but the accelerator is {name!r}. Valid accelerators for it: "
        f"'xla', 'tpu' (or 'auto' with PJRT_DEVICE set). Fix: Trainer(accelerator='xla', strategy={strategy!r}), "
        f"or pick a strategy for {name!r} such as 'auto'."
    )
    raise MisconfigurationError(msg)


def wrap_dataloader(dataloader: Any, device: torch.device, **loader_kwargs: Any) -> Any:
    """Wrap ``dataloader`` in torch-xla's ``MpDeviceLoader`` (background host-to-device copies).

    The wrapper also cuts the graph once per batch. It keeps ``dataset`` and ``batch_sampler``
    visible so code that inspects a DataLoader still works; objects without ``__len__`` pass
    through unwrapped, because the loops need a length to plan epochs on XLA.
    """
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    if isinstance(dataloader, MpDeviceLoader) or not hasattr(dataloader, "__len__"):
        return dataloader
    wrapped = MpDeviceLoader(dataloader, device, **loader_kwargs)
    wrapped.dataset = getattr(dataloader, "dataset", None)  # type: ignore[attr-defined]
    wrapped.batch_sampler = getattr(dataloader, "batch_sampler", None)  # type: ignore[attr-defined]
    wrapped.sampler = getattr(dataloader, "sampler", None)  # type: ignore[attr-defined]
    return wrapped


class XLAStrategyMixin:
    """Overrides shared by single_xla, xla and xla_fsdp; listed first among the bases."""

    strategy_name: ClassVar[str]

    @property
    def supports_inference_mode(self) -> bool:
        """False: XLA tensors are traced into graphs, and inference tensors cannot be; evaluation uses no_grad."""
        return False

    # ------------------------------------------------------------------ parts
    def adapt_accelerator(self, accelerator: Accelerator) -> Accelerator:
        """The XLA accelerator is kept; anything else is refused (given or assigned)."""
        check_accelerator(self.strategy_name, accelerator)
        return accelerator

    def adapt_precision_plugin(self, precision_plugin: Precision) -> Precision:
        """The core's bf16 precisions are swapped for XLA's; fp16 / fp64 are refused."""
        adapted = to_xla_precision(precision_plugin)
        assert adapted is not None
        return adapted

    def default_checkpoint_io(self) -> CheckpointIO:
        """XLA checkpoint IO: tensors to CPU, the master ordinal writes."""
        from phalanx_strategy_xla.checkpoint_io import XLACheckpointIO

        return XLACheckpointIO()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: PathLike, storage_options: Any | None = None
    ) -> None:
        """Every replica calls the IO: tensors must leave every device, the IO meets the replicas at a
        rendezvous, and a sharded save writes each host's shards (the master ordinal publishes).
        The core's default, rank 0 alone, would leave the other hosts of an ``xla`` or ``xla_fsdp``
        run out of that rendezvous."""
        self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)  # type: ignore[attr-defined]

    def setup_distributed(self) -> None:
        """No torch.distributed group: torch-xla's runtime connects the replicas (collectives use ``xm``)."""

    def default_accelerator(self) -> Accelerator:
        from phalanx_strategy_xla.accelerator import XLAAccelerator

        return XLAAccelerator()

    # ------------------------------------------------------------------ training
    def process_dataloader(self, dataloader: Any) -> Any:
        """Feed batches through ``MpDeviceLoader`` on this process's device."""
        _runtime.import_torch_xla(f"strategy={self.strategy_name!r}")
        return wrap_dataloader(dataloader, self.root_device)  # type: ignore[attr-defined]

    def backward(
        self, closure_loss: torch.Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """Backward through the precision; explains torch's cryptic failure when CPU autograd ran first.

        Raises:
            PhalanxError: The autograd engine started before the XLA runtime (pytorch/xla#4174).
        """
        try:
            return super().backward(closure_loss, optimizer, *args, **kwargs)  # type: ignore[misc, no-any-return]
        except RuntimeError as err:
            if "device_ready_queues_" not in str(err):
                raise
            msg = (
                f"strategy={self.strategy_name!r}: backward on the XLA device failed because PyTorch's autograd engine "
                "started before the XLA runtime did (a backward pass ran on another device earlier in this process, "
                "e.g. a CPU reference run; pytorch/xla issue 4174). Fix: start XLA first by calling "
                "torch_xla.runtime.global_runtime_device_count() right after importing torch_xla, before any CPU "
                "backward, or run the CPU work in another process."
            )
            raise PhalanxError(msg) from err

    def _reduce_gradients(self, optimizer: Optimizer) -> None:
        """All-reduce gradients across replicas; single-process strategies have nothing to do."""

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """Closure, gradient all-reduce (before clipping sees them), step, then cut the graph."""
        import torch_xla

        def reducing_closure() -> Any:
            result = closure()
            self._reduce_gradients(optimizer)
            return result

        output = super().optimizer_step(optimizer, reducing_closure, model, **kwargs)  # type: ignore[misc]
        torch_xla.sync()
        return output
