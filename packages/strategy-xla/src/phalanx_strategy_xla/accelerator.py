"""The XLA accelerator: devices driven by torch-xla's PJRT runtime (TPU cores, or XLA:CPU).

Registered as ``"xla"`` and, as Lightning users know it, ``"tpu"``. It counts devices without
starting the runtime (see ``_runtime``), so ``Trainer(accelerator="tpu", devices=8)`` can be
validated in the parent process before torch-xla's launcher forks the workers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from phalanx.accelerators.accelerator import Accelerator, DevicesArg
from phalanx_strategy_xla import _runtime

__all__ = ["XLAAccelerator"]


class XLAAccelerator(Accelerator):
    """TPUs and other PJRT devices through torch-xla; ``devices`` are XLA device indices."""

    name: ClassVar[str] = "xla"

    @staticmethod
    def is_available() -> bool:
        """Whether torch-xla imports and its runtime would expose at least one device."""
        try:
            return _runtime.visible_device_count() > 0
        except Exception:
            return False

    @staticmethod
    def auto_device_count() -> int:
        """All devices the runtime exposes on this host (``CPU_NUM_DEVICES`` on XLA:CPU)."""
        try:
            return _runtime.visible_device_count()
        except ImportError:
            return 0

    @classmethod
    def parse_devices(cls, devices: DevicesArg) -> int | list[int]:
        """Parse ``devices=`` like every enumerable accelerator, naming the PJRT device type in errors."""
        try:
            return super().parse_devices(devices)
        except Exception as err:
            kind = _safe_device_type()
            hint = (
                " On XLA:CPU set CPU_NUM_DEVICES=<n> before the first XLA call to expose n devices."
                if kind == "CPU"
                else ""
            )
            raise type(err)(f"{err} (PJRT device type: {kind}).{hint}") from err

    @classmethod
    def get_parallel_devices(cls, devices: DevicesArg) -> list[torch.device]:
        """One ``torch.device("xla", i)`` per selected index."""
        parsed = cls.parse_devices(devices)
        indices = list(range(parsed)) if isinstance(parsed, int) else parsed
        return [torch.device("xla", index) for index in indices]

    def get_device_stats(self, device: torch.device | str | int) -> dict[str, Any]:
        """Memory numbers torch-xla reports for ``device`` (bytes), where the runtime has them."""
        import torch_xla.core.xla_model as xm

        target = device if isinstance(device, torch.device) else torch.device("xla", int(str(device).split(":")[-1]))
        try:
            info = xm.get_memory_info(target)
        except Exception:
            return {}
        return {f"xla_{key}": value for key, value in dict(info).items()}

    def teardown(self) -> None:
        """Nothing to release: the PJRT client lives for the whole process, by torch-xla's design."""


def _safe_device_type() -> str:
    try:
        return _runtime.device_type()
    except Exception:
        return "unknown"
