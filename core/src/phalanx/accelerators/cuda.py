"""The CUDA accelerator: NVIDIA (and ROCm, which PyTorch exposes as "cuda") GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, ClassVar

import torch

from phalanx.accelerators.accelerator import Accelerator
from phalanx.errors import MisconfigurationError

__all__ = ["CUDAAccelerator", "find_usable_cuda_devices", "get_nvidia_gpu_stats"]


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


def find_usable_cuda_devices(num_devices: int = -1) -> list[int]:
    """Indices of visible GPUs that accept a tensor now: ``num_devices`` of them, or all with ``-1``.

    A GPU in exclusive mode that another process holds refuses the allocation and is skipped; pass
    the result as ``Trainer(devices=...)``. Two processes asking at the same moment can both see a
    free GPU: the check is not a reservation.

    Raises:
        ValueError: No GPU is visible, or more were asked for than are visible.
        RuntimeError: Fewer than ``num_devices`` are free; the message names the busy ones.
    """
    if num_devices == 0:
        return []
    visible = list(range(_num_cuda_devices()))
    if not visible:
        msg = f"find_usable_cuda_devices({num_devices}): no CUDA device is visible on this machine"
        raise ValueError(msg)
    if num_devices > len(visible):
        msg = f"find_usable_cuda_devices({num_devices}): this machine has only {len(visible)} visible GPUs"
        raise ValueError(msg)
    usable: list[int] = []
    busy: list[int] = []
    for index in visible:
        try:
            torch.tensor(0, device=torch.device("cuda", index))
        except RuntimeError:
            busy.append(index)
            continue
        usable.append(index)
        if len(usable) == num_devices:
            break
    if num_devices != -1 and len(usable) != num_devices:
        msg = (
            f"find_usable_cuda_devices({num_devices}): only {len(usable)} GPUs accept work now; {busy} are held by "
            "other processes. Fix: ask for fewer, or wait for them to be released."
        )
        raise RuntimeError(msg)
    return usable


#: nvidia-smi's query fields read by :func:`get_nvidia_gpu_stats`, with their units.
_NVIDIA_SMI_FIELDS = (
    ("utilization.gpu", "%"),
    ("memory.used", "MB"),
    ("memory.free", "MB"),
    ("utilization.memory", "%"),
    ("fan.speed", "%"),
    ("temperature.gpu", "°C"),
    ("temperature.memory", "°C"),
)


def get_nvidia_gpu_stats(device: torch.device | str | int) -> dict[str, float]:
    """Utilisation, memory, fan speed and temperatures of ``device`` as ``nvidia-smi`` reports them.

    Keys are ``"<field> (<unit>)"`` (e.g. ``"memory.used (MB)"``); a field the GPU does not report
    reads 0. The device index is mapped through ``CUDA_VISIBLE_DEVICES`` to the physical GPU.

    Raises:
        FileNotFoundError: ``nvidia-smi`` is not on the ``PATH``.
    """
    executable = shutil.which("nvidia-smi")
    if executable is None:
        msg = "nvidia-smi: command not found (get_nvidia_gpu_stats reads it; install the NVIDIA driver utilities)"
        raise FileNotFoundError(msg)
    index = device if isinstance(device, int) else (torch.device(device).index or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(_num_cuda_devices()))).split(",")
    gpu_id = visible[index].strip()
    query = ",".join(name for name, _ in _NVIDIA_SMI_FIELDS)
    result = subprocess.run(
        [executable, f"--query-gpu={query}", "--format=csv,nounits,noheader", f"--id={gpu_id}"],
        encoding="utf-8",
        capture_output=True,
        check=True,
    )

    def number(text: str) -> float:
        try:
            return float(text)
        except ValueError:  # "[N/A]" for a field this GPU lacks
            return 0.0

    values = [number(cell) for cell in result.stdout.strip().split(", ")]
    return {f"{name} ({unit})": value for (name, unit), value in zip(_NVIDIA_SMI_FIELDS, values)}
