"""single_xla: one XLA device (a TPU core, a PJRT GPU, or XLA:CPU) in the current process.

No launcher and no collectives; the difference from ``single_device`` is how work reaches the
device: batches stream through ``MpDeviceLoader`` and every optimizer step ends with
``torch_xla.sync()``, so each training step compiles once and then replays.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
from phalanx.errors import MisconfigurationError
from phalanx.precision.precision import Precision
from phalanx.strategies.single_device import SingleDeviceStrategy
from phalanx_strategy_xla import _runtime
from phalanx_strategy_xla._strategy_base import XLAStrategyMixin, check_accelerator

__all__ = ["SingleDeviceXLAStrategy"]


class SingleDeviceXLAStrategy(XLAStrategyMixin, SingleDeviceStrategy):
    """Train on one XLA device in this process.

    Args:
        device: ``"xla"`` (device 0), ``"xla:1"``, an index, or ``torch.device("xla", i)``.
        accelerator: The XLA accelerator; any other raises.
        checkpoint_io: Defaults to :class:`~phalanx_strategy_xla.checkpoint_io.XLACheckpointIO`.
        precision_plugin: "32-true", or XLA's bf16 precisions; fp16/fp64 raise.

    Raises:
        MisconfigurationError: ``device`` is not an XLA device, or a non-XLA accelerator is given.
    """

    strategy_name: ClassVar[str] = "single_xla"

    def __init__(
        self,
        device: str | int | torch.device = "xla",
        *,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        check_accelerator(self.strategy_name, accelerator)
        resolved = _xla_device(device)
        super().__init__(
            resolved,
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )

    @property
    def root_device(self) -> torch.device:
        """The XLA device; torch-xla is imported first so torch knows the ``xla`` backend."""
        _runtime.import_torch_xla(f"strategy={self.strategy_name!r}")
        return super().root_device

    def setup_environment(self) -> None:
        """Check the device index exists, then let the accelerator check the device type.

        Raises:
            MisconfigurationError: The index is not among the devices the runtime exposes.
        """
        visible = _runtime.visible_device_count()
        device = super().root_device  # the index only: torch-xla is not needed for it
        index = device.index or 0
        if index >= visible:
            msg = (
                f"single_xla got device {str(device)!r} but the XLA runtime exposes {visible} device(s) "
                f"(indices {list(range(visible))}). Fix: pass devices=1 or an index below {visible}"
                + ("; on XLA:CPU, CPU_NUM_DEVICES sets the count." if _runtime.device_type() == "CPU" else ".")
            )
            raise MisconfigurationError(msg)
        super().setup_environment()

    def __repr__(self) -> str:
        return f"SingleDeviceXLAStrategy(device={str(super().root_device)!r}, precision_plugin={self.precision_plugin!r})"


def _xla_device(device: str | int | torch.device) -> torch.device:
    """Normalise a device argument to ``torch.device("xla", index)``."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("xla", device)
    try:
        resolved = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError) as err:
        msg = f"single_xla got device={device!r}, which is not a torch device ({err}); pass 'xla', 'xla:1' or an index."
        raise MisconfigurationError(msg) from err
    if resolved.type != "xla":
        msg = (
            f"single_xla got device={str(resolved)!r}, which is not an XLA device; valid: 'xla', 'xla:<index>' or "
            "an index (with the Trainer: accelerator='xla' or 'tpu'). For CPU or GPU training use "
            "strategy='single_device'."
        )
        raise MisconfigurationError(msg)
    return torch.device("xla", resolved.index or 0)
