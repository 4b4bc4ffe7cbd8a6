"""The CUDA accelerator: NVIDIA (and ROCm, which PyTorch exposes as "cuda") GPUs."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from phalanx.accelerators.accelerator import Accelerator
from phalanx.errors import MisconfigurationError

__all__ = ["CUDAAccelerator"]


def _num_cuda_devices() -> int:
    """Count GPUs without creating a CUDA context when possible.

    A CUDA context created in the parent process breaks the fork-based launcher, so the NVML
    count (which touches no context) is preferred and the runtime count is only the fallback.
    """
    if not torch.backends.cuda.is_built():
        return 0
    nvml_count = getattr(torch.cuda, "_device_count_nvml", None)
    if callable(nvml_count):
        try:
            count = int(nvml_count())
        except Exception:
            count = -1
        if count >= 0:
            return count
    return torch.cuda.device_count()


class CUDAAccelerator(Accelerator):
    """Runs on CUDA GPUs; ``devices`` selects GPU indices."""

    name: ClassVar[str] = "cuda"

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` the current GPU so default allocations (and NCCL) land on it.

        Raises:
            MisconfigurationError: ``device`` is not a CUDA device.
        """
        super().setup_device(device)
        torch.cuda.set_device(device)

    def teardown(self) -> None:
        """Return cached blocks to the driver so a following run (or process) can use them."""
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    @staticmethod
    def is_available() -> bool:
        """Whether at least one GPU is visible to this process."""
        return _num_cuda_devices() > 0

    @staticmethod
    def auto_device_count() -> int:
        """All visible GPUs."""
        return _num_cuda_devices()

    def get_device_stats(self, device: torch.device | str | int) -> dict[str, Any]:
        """The allocator's counters for ``device`` (``torch.cuda.memory_stats``).

        Raises:
            MisconfigurationError: ``device`` is not a CUDA device.
        """
        target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if target.type != "cuda":
            msg = f"CUDAAccelerator.get_device_stats got device {str(target)!r}; pass a cuda device such as 'cuda:0'."
            raise MisconfigurationError(msg)
        return dict(torch.cuda.memory_stats(target))
