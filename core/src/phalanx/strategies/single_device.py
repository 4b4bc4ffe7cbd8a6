"""SingleDeviceStrategy: one process, one device, no wrapper.

The default for ``devices=1``. Collectives are identities because there is nobody to talk to;
that lets the Trainer call ``reduce``/``all_gather``/``barrier`` unconditionally.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies._collectives import TBroadcast
from phalanx.strategies.configuration import StrategyConfiguration
from phalanx.strategies.strategy import Strategy

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    """Train on exactly one device in the current process.

    Args:
        device: The device, e.g. ``"cpu"``, ``"cuda:1"``, ``torch.device("mps")`` or a CUDA index;
            ``None`` takes the Trainer's device (``devices=[1]`` -> ``cuda:1``), else the CPU.
        accelerator: The matching accelerator; inferred from ``device`` when ``None``.
        checkpoint_io: See :class:`~phalanx.strategies.strategy.Strategy`.
        precision_plugin: See :class:`~phalanx.strategies.strategy.Strategy`.

    Raises:
        MisconfigurationError: ``device`` is not a valid torch device.
    """

    #: Calls the Module directly: the Trainer may take the direct step.
    passes_step_through = True

    strategy_name: ClassVar[str] = "single_device"

    def __init__(
        self,
        device: str | int | torch.device | None = None,
        *,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        super().__init__(accelerator, checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self._device_given = device is not None
        if device is None:
            self._root_device = torch.device("cpu")
        elif isinstance(device, torch.device):
            self._root_device = device
        else:
            try:
                self._root_device = torch.device(device)
            except (RuntimeError, TypeError) as error:
                msg = (
                    f"SingleDeviceStrategy(device={device!r}) is not a valid torch device ({error}); pass "
                    "e.g. 'cpu', 'cuda:0', 'mps' or a torch.device."
                )
                raise MisconfigurationError(msg) from error

    @property
    def root_device(self) -> torch.device:
        """The one device everything runs on."""
        return self._root_device

    def configure(self, config: StrategyConfiguration) -> None:
        """Take the Trainer's device unless one was given; refuse more than one process."""
        if config.num_processes > 1:
            msg = (
                f"Trainer(strategy={config.strategy_name!r}) runs one process on one device, but "
                f"devices={config.devices!r} and num_nodes={config.num_nodes} ask for {config.num_processes}. "
                "Fix: use strategy='auto' or 'ddp' (see `phalanx strategies`), or devices=1."
            )
            raise MisconfigurationError(msg)
        super().configure(config)
        if not self._device_given and config.parallel_devices:
            self._root_device = config.parallel_devices[0]

    @property
    def is_global_zero(self) -> bool:
        """Always True: this is the only process."""
        return True

    def model_to_device(self) -> None:
        """Move the Module's parameters and buffers to the device."""
        self.require_module().to(self.root_device)

    def all_gather(
        self,
        tensor: torch.Tensor,
        group: Any | None = None,
        sync_grads: bool = False,
    ) -> torch.Tensor:
        """The tensor itself: with one process there is nothing to gather (no extra dimension)."""
        return tensor

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any | None = "mean") -> Any:
        """The tensor unchanged: the mean or sum over one process is the value itself."""
        return tensor

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """The object itself."""
        return obj

    def barrier(self, name: str | None = None) -> None:
        """Nothing to wait for."""

    def __repr__(self) -> str:
        device = str(self.root_device)
        return f"SingleDeviceStrategy(device={device!r}, precision_plugin={self.precision_plugin!r})"
