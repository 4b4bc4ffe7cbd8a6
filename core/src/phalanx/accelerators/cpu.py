"""The CPU accelerator: every process computes on the host.

On CPU a "device" is a process, not a piece of hardware: ``devices=4`` with a parallel strategy
starts four processes that all use ``torch.device("cpu")``. That is how DDP and FSDP train on
CPU-only machines (over gloo), so the parsing differs from the enumerable accelerators.
"""

from __future__ import annotations

import os
import sys
from typing import Any, ClassVar

import torch

from phalanx.accelerators.accelerator import Accelerator, DevicesArg
from phalanx.errors import MisconfigurationError

__all__ = ["CPUAccelerator"]


class CPUAccelerator(Accelerator):
    """Runs on the host CPU; ``devices`` is the number of processes."""

    name: ClassVar[str] = "cpu"

    @staticmethod
    def is_available() -> bool:
        """A CPU is always there."""
        return True

    @staticmethod
    def auto_device_count() -> int:
        """``devices="auto"`` means one process: more processes on one host rarely speed up CPU work."""
        return 1

    @classmethod
    def parse_devices(cls, devices: DevicesArg) -> int:
        """Return the number of processes requested.

        Accepts a positive int, a count string like ``"2"`` or ``"auto"`` (one process). Index
        lists and ``-1`` are rejected: CPU processes are not numbered hardware, and "all CPUs"
        would start one process per core, which is almost never what anyone wants.

        Raises:
            MisconfigurationError: For any other value, naming the fix.
        """
        if isinstance(devices, str) and devices.strip().lower() == "auto":
            return cls.auto_device_count()
        count: Any = devices
        if isinstance(devices, str) and devices.strip().isdigit():
            count = int(devices.strip())
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            msg = (
                f"devices={devices!r} is not valid for the cpu accelerator: there `devices` is the "
                'number of processes. Pass a positive int such as devices=2, or devices="auto" (1).'
            )
            raise MisconfigurationError(msg)
        return count

    @classmethod
    def get_parallel_devices(cls, devices: DevicesArg) -> list[torch.device]:
        """One ``torch.device("cpu")`` per process."""
        return [torch.device("cpu")] * cls.parse_devices(devices)

    def get_device_stats(self, device: torch.device | str | int) -> dict[str, Any]:
        """Host load and this process's peak resident memory, from the standard library only."""
        stats: dict[str, Any] = {"cpu_count": os.cpu_count() or 1}
        if hasattr(os, "getloadavg"):
            stats["cpu_load_avg_1m"] = os.getloadavg()[0]
        try:
            import resource
        except ImportError:  # Windows
            return stats
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is KiB on Linux, bytes on macOS.
        stats["peak_rss_bytes"] = peak if sys.platform == "darwin" else peak * 1024
        return stats
