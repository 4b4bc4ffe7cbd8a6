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

__all__ = ["CPUAccelerator", "get_cpu_stats"]


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
        """Host CPU and memory use under Lightning's keys (:func:`get_cpu_stats`), plus ``cpu_count``."""
        return {**get_cpu_stats(), "cpu_count": float(os.cpu_count() or 1)}


def get_cpu_stats() -> dict[str, float]:
    """``cpu_percent``, ``cpu_vm_percent`` and ``cpu_swap_percent``, system-wide, as Lightning logs them.

    With psutil installed the values are psutil's (``cpu_percent`` since the previous call, so the
    first call reads 0). Without it they come from the standard library so the numbers still
    exist: ``cpu_percent`` is the 1-minute load average over the core count (capped at 100), the
    memory figures are read from ``/proc/meminfo`` (Linux; elsewhere only ``cpu_percent``), and
    ``peak_rss_bytes`` adds this process's peak resident memory from ``resource``.
    """
    try:
        import psutil
    except ImportError:
        return _stdlib_cpu_stats()
    return {
        "cpu_vm_percent": float(psutil.virtual_memory().percent),
        "cpu_percent": float(psutil.cpu_percent()),
        "cpu_swap_percent": float(psutil.swap_memory().percent),
    }


def _percent_used(total: float, free: float) -> float:
    return 0.0 if total <= 0 else 100.0 * (total - free) / total


def _stdlib_cpu_stats() -> dict[str, float]:
    stats: dict[str, float] = {}
    if hasattr(os, "getloadavg"):
        stats["cpu_percent"] = min(100.0, 100.0 * os.getloadavg()[0] / (os.cpu_count() or 1))
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            info = {line.split(":")[0]: float(line.split()[1]) for line in handle if len(line.split()) >= 2}
    except OSError:
        info = {}
    if "MemTotal" in info and "MemAvailable" in info:
        stats["cpu_vm_percent"] = _percent_used(info["MemTotal"], info["MemAvailable"])
    if "SwapTotal" in info and "SwapFree" in info:
        stats["cpu_swap_percent"] = _percent_used(info["SwapTotal"], info["SwapFree"])
    try:
        import resource
    except ImportError:  # Windows
        return stats
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is KiB on Linux, bytes on macOS.
    stats["peak_rss_bytes"] = float(peak if sys.platform == "darwin" else peak * 1024)
    return stats
