"""The MPS accelerator: Apple-silicon GPUs through Metal."""

from __future__ import annotations

import platform
from typing import Any, ClassVar

import torch

from phalanx.accelerators.accelerator import Accelerator

__all__ = ["MPSAccelerator", "get_device_stats"]


class MPSAccelerator(Accelerator):
    """Runs on the single Apple-silicon GPU; ``devices`` can only select index 0."""

    name: ClassVar[str] = "mps"

    def teardown(self) -> None:
        """Release cached Metal buffers."""
        if MPSAccelerator.is_available():
            torch.mps.empty_cache()

    @staticmethod
    def is_available() -> bool:
        """MPS exists only on arm64 macOS with a PyTorch build that includes it."""
        mps = getattr(torch.backends, "mps", None)
        return bool(mps is not None and mps.is_available() and platform.processor() in ("arm", "arm64"))

    @staticmethod
    def auto_device_count() -> int:
        """Apple silicon exposes one GPU."""
        return 1 if MPSAccelerator.is_available() else 0

    def get_device_stats(self, device: torch.device | str | int) -> dict[str, Any]:
        """Memory held by tensors and by the Metal driver."""
        if not MPSAccelerator.is_available():
            return {}
        return {
            "mps_allocated_bytes": torch.mps.current_allocated_memory(),
            "mps_driver_allocated_bytes": torch.mps.driver_allocated_memory(),
        }


def get_device_stats() -> dict[str, float]:
    """The host's memory, CPU and swap use in percent (Apple silicon shares its memory with the GPU).

    Keys are Lightning's: ``M1_vm_percent``, ``M1_percent``, ``M1_swap_percent``.

    Raises:
        ModuleNotFoundError: psutil is not installed (``pip install 'phalanx-core[extra]'``).
    """
    try:
        import psutil
    except ImportError as error:
        msg = "get_device_stats reads the host's memory through psutil, which is not installed. Fix: pip install psutil"
        raise ModuleNotFoundError(msg) from error
    return {
        "M1_vm_percent": psutil.virtual_memory().percent,
        "M1_percent": psutil.cpu_percent(),
        "M1_swap_percent": psutil.swap_memory().percent,
    }
