"""Throughput arithmetic: samples, batches, items and FLOPs per second, and the share of peak (MFU).

A loss curve says whether a run learns; throughput says whether it uses the hardware it pays for.
:class:`Throughput` keeps a rolling window of cumulative counters (time, batches, samples, items,
FLOPs) and turns them into rates; :func:`get_available_flops` is the denominator of the model
FLOPs utilisation (MFU); :func:`measure_flops` counts a step's FLOPs on a meta-device model. The
names, arguments and metric keys are Lightning's (``lightning.fabric.utilities.throughput``), so
dashboards built on ``train/device/samples_per_sec`` keep working.

Peak FLOPs of a CPU: Lightning has no CPU entry (it returns None, so no MFU on CPU). phalanx
estimates it as *usable cores x a documented per-core figure* (:data:`CPU_FLOPS_PER_CORE`): 100
GFLOP/s per core in float32 and the 16-bit formats, half that in float64, i.e. a ~3 GHz core
retiring two 256-bit fused multiply-adds per cycle (AVX2 FMA: 2 units x 8 lanes x 2 FLOPs x 3e9).
It is an order-of-magnitude peak, not a measurement, so a CPU MFU is comparable between runs on one
machine rather than against a GPU's datasheet. A measured figure would vary with load and cost a
benchmark per process; set ``available_flops`` yourself (``Throughput(available_flops=...)``) when
you know your CPU's peak.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, TypeVar

import torch

from phalanx.errors import MisconfigurationError
from phalanx.utilities.flops import measure_flops
from phalanx.utilities.rank_zero import rank_zero_warn

__all__ = [
    "CPU_FLOPS_PER_CORE",
    "Throughput",
    "get_available_flops",
    "measure_flops",
    "precision_to_compute_dtype",
]

#: Peak FLOP/s of one CPU core per dtype (see the module docstring for where the figure comes from).
CPU_FLOPS_PER_CORE: dict[torch.dtype, float] = {
    torch.float64: 50e9,
    torch.float32: 100e9,
    torch.bfloat16: 100e9,
    torch.float16: 100e9,
}

# Dense (no sparsity) peak FLOP/s from NVIDIA's datasheets (their headline numbers assume 2:4
# sparsity, so those are halved here). "tf32" applies to float32 matmuls when
# torch.get_float32_matmul_precision() is not "highest".
_CUDA_FLOPS: dict[str, dict[Any, float]] = {
    "h200": {torch.float64: 67e12, torch.float32: 67e12, "tf32": 989e12 / 2, torch.bfloat16: 1979e12 / 2,
             torch.float16: 1979e12 / 2, torch.int8: 3958e12 / 2},
    "h100-sxm": {torch.float64: 67e12, torch.float32: 67e12, "tf32": 989e12 / 2, torch.bfloat16: 1979e12 / 2,
                 torch.float16: 1979e12 / 2, torch.int8: 3958e12 / 2},
    "h100-pcie": {torch.float64: 51e12, torch.float32: 51e12, "tf32": 756e12 / 2, torch.bfloat16: 1513e12 / 2,
                  torch.float16: 1513e12 / 2, torch.int8: 3026e12 / 2},
    "a100": {torch.float64: 19.5e12, torch.float32: 19.5e12, "tf32": 156e12, torch.bfloat16: 312e12,
             torch.float16: 312e12, torch.int8: 624e12},
    "a10g": {torch.float32: 31.2e12, "tf32": 62.5e12, torch.bfloat16: 125e12, torch.float16: 125e12,
             torch.int8: 250e12},
    "l4": {torch.float32: 30.3e12, "tf32": 120e12 / 2, torch.bfloat16: 242e12 / 2, torch.float16: 242e12 / 2,
           torch.int8: 485e12 / 2},
    "v100-sxm": {torch.float64: 7.8e12, torch.float32: 15.7e12, torch.float16: 125e12},
    "v100-pcie": {torch.float64: 7e12, torch.float32: 14e12, torch.float16: 112e12},
    "t4": {torch.float32: 8.1e12, torch.float16: 65e12, torch.int8: 130e12},
}  # fmt: skip

# One figure per TPU generation: matmuls run in bfloat16 whatever the dtype.
_TPU_FLOPS = {"v2": 45e12, "v3": 123e12, "v4": 275e12, "v5litepod": 197e12, "v5p": 459e12}

_PRECISION_DTYPES = {
    "64-true": torch.float64,
    "32-true": torch.float32,
    "16-true": torch.float16,
    "16-mixed": torch.float16,
    "bf16-true": torch.bfloat16,
    "bf16-mixed": torch.bfloat16,
    "transformer-engine": torch.int8,
    "transformer-engine-float16": torch.int8,
}


def precision_to_compute_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in under a canonical precision name (``trainer.precision``).

    Unknown names (a plugin's precision) count as float32, as Lightning's fallback does.
    """
    return _PRECISION_DTYPES.get(str(precision), torch.float32)


def _cuda_chip(name: str) -> str | None:
    """The table key for a ``torch.cuda.get_device_name`` string, matched on whole words (an L40S is no L4)."""
    words = name.lower().replace("_", " ").split()
    if "h200" in words:
        return "h200"
    if "h100" in words:
        return "h100-sxm" if "hbm3" in words or "sxm5" in words else "h100-pcie" if "pcie" in words else None
    for word in words:
        for chip in ("a100", "a10g", "l4", "t4", "v100-sxm", "v100-pcie"):
            if word == chip or word.startswith(f"{chip}-") or (chip.startswith("v100") and word.startswith(chip)):
                return chip
    return None


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def get_available_flops(device: torch.device, dtype: torch.dtype | str) -> int | None:
    """Peak FLOP/s of one ``device`` computing in ``dtype``, or None (with a warning) when unknown.

    CUDA and TPU figures come from the vendors' datasheets (dense, no sparsity); CPU is estimated
    as usable cores x :data:`CPU_FLOPS_PER_CORE` (module docstring).
    """
    if device.type == "cpu":
        per_core = CPU_FLOPS_PER_CORE.get(dtype) if isinstance(dtype, torch.dtype) else None
        if per_core is None:
            rank_zero_warn(f"No CPU peak FLOPs figure for {dtype}; MFU is not computed", category=RuntimeWarning)
            return None
        return int(per_core * _usable_cores())
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        chip = _cuda_chip(name)
        if chip is None:
            rank_zero_warn(f"FLOPs not found for {name!r}", category=RuntimeWarning)
            return None
        table = _CUDA_FLOPS[chip]
        if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest" and "tf32" in table:
            dtype = "tf32"
        if dtype not in table:
            rank_zero_warn(f"{name!r} does not support {dtype} (or its FLOPs are unknown)", category=RuntimeWarning)
            return None
        return int(table[dtype])
    if device.type == "xla":
        # the TPU VM's accelerator type, e.g. "v4-8" (the core does not import torch_xla: plugins own it)
        chip = os.environ.get("TPU_ACCELERATOR_TYPE", "").lower().split("-")[0]
        if chip not in _TPU_FLOPS:
            rank_zero_warn(f"FLOPs not found for TPU {chip!r} with {dtype}", category=RuntimeWarning)
            return None
        return int(_TPU_FLOPS[chip])
    return None


T = TypeVar("T", bound=float)


class _MonotonicWindow(list[T]):
    """A fixed-size window that only grows to the right and only accepts increasing values.

    The counters are cumulative, so a value that does not increase means a caller passed per-batch
    numbers instead of totals; failing loudly beats logging nonsense rates.
    """

    def __init__(self, maxlen: int) -> None:
        super().__init__()
        self.maxlen = maxlen

    def append(self, value: T) -> None:
        if self and self[-1] >= value:
            msg = (
                f"Expected the value to increase, last: {self[-1]}, current: {value}. Throughput.update takes "
                "running totals (time since start, batches/samples seen so far), not per-batch values."
            )
            raise ValueError(msg)
        super().append(value)
        if len(self) > self.maxlen:
            del self[0]


class Throughput:
    """Rolling-window throughput from cumulative counters (Lightning's ``Throughput``).

    Keys of :meth:`compute` (``/`` is ``separator``): ``time``, ``batches``, ``samples``,
    ``lengths`` (totals); once the window is full, ``device/batches_per_sec``,
    ``device/samples_per_sec``, ``device/items_per_sec`` (with lengths), ``device/flops_per_sec``
    and ``device/mfu`` (with FLOPs and ``available_flops``); with ``world_size > 1`` also the
    global ``batches_per_sec``, ``samples_per_sec``, ``items_per_sec`` and ``flops_per_sec`` (the
    per-device rate times the world size: every device is assumed to run at the same speed).

    Args:
        available_flops: Peak FLOP/s of one device (:func:`get_available_flops`); None: no MFU.
        world_size: Processes taking part; global metrics appear when it is above 1.
        window_size: Batches in the rolling window (at least 2: rates are differences).
        separator: Between ``device`` and the metric name.

    Raises:
        MisconfigurationError: ``world_size`` < 1 or ``window_size`` < 2.
    """

    def __init__(
        self, available_flops: float | None = None, world_size: int = 1, window_size: int = 100, separator: str = "/"
    ) -> None:
        if world_size < 1:
            msg = f"Throughput(world_size={world_size!r}) is invalid; pass the number of processes (>= 1)."
            raise MisconfigurationError(msg)
        if window_size < 2:
            msg = f"Throughput(window_size={window_size!r}) is invalid; rates need two points, pass 2 or more."
            raise MisconfigurationError(msg)
        self.available_flops = available_flops
        self.world_size = world_size
        self.separator = separator
        self._time: _MonotonicWindow[float] = _MonotonicWindow(window_size)
        self._batches: _MonotonicWindow[int] = _MonotonicWindow(window_size)
        self._samples: _MonotonicWindow[int] = _MonotonicWindow(window_size)
        self._lengths: _MonotonicWindow[int] = _MonotonicWindow(window_size)
        self._flops: deque[float] = deque(maxlen=window_size)

    def update(
        self, *, time: float, batches: int, samples: int, lengths: int | None = None, flops: float | None = None
    ) -> None:
        """Record running totals.

        Args:
            time: Seconds since the start; increases with every call.
            batches: Batches seen by this device so far.
            samples: Samples seen by this device so far.
            lengths: Items (e.g. tokens) seen by this device so far.
            flops: FLOPs of the latest batch on this device (``measure_flops``).

        Raises:
            RuntimeError: ``lengths`` is given on some calls and not on others.
        """
        self._time.append(time)
        self._batches.append(batches)
        self._samples.append(samples)
        if lengths is not None:
            self._lengths.append(lengths)
            if len(self._samples) != len(self._lengths):
                msg = (
                    f"If lengths are passed ({len(self._lengths)}), there needs to be the same number of samples "
                    f"({len(self._samples)}): pass lengths on every update or on none."
                )
                raise RuntimeError(msg)
        if flops is not None:
            self._flops.append(flops * self.world_size)  # all ranks together

    def compute(self) -> dict[str, int | float]:
        """The totals and, once the window is full, the rates (class docstring)."""
        sep = self.separator
        metrics: dict[str, int | float] = {
            "time": self._time[-1],
            "batches": self._batches[-1],
            "samples": self._samples[-1],
        }
        if self._lengths:
            metrics["lengths"] = self._lengths[-1]
        many = self.world_size > 1
        elapsed_time = self._time[-1] - self._time[0]
        if len(self._time) == self._time.maxlen:
            dev_batches_per_sec = (self._batches[-1] - self._batches[0]) / elapsed_time
            dev_samples_per_sec = (self._samples[-1] - self._samples[0]) / elapsed_time
            metrics[f"device{sep}batches_per_sec"] = dev_batches_per_sec
            metrics[f"device{sep}samples_per_sec"] = dev_samples_per_sec
            if many:
                metrics["batches_per_sec"] = dev_batches_per_sec * self.world_size
                metrics["samples_per_sec"] = dev_samples_per_sec * self.world_size
            if len(self._lengths) == self._lengths.maxlen:
                dev_items_per_sec = (self._lengths[-1] - self._lengths[0]) / elapsed_time
                metrics[f"device{sep}items_per_sec"] = dev_items_per_sec
                if many:
                    metrics["items_per_sec"] = dev_items_per_sec * self.world_size
        if len(self._flops) == self._flops.maxlen:
            # the first batch's FLOPs were spent before the window's first time point
            flops_per_sec = (sum(self._flops) - self._flops[0]) / elapsed_time
            dev_flops_per_sec = flops_per_sec / self.world_size
            if many:
                metrics["flops_per_sec"] = flops_per_sec
            metrics[f"device{sep}flops_per_sec"] = dev_flops_per_sec
            if self.available_flops:
                metrics[f"device{sep}mfu"] = dev_flops_per_sec / self.available_flops
                if many:
                    metrics["mfu"] = flops_per_sec / (self.available_flops * self.world_size)
        return metrics

    @property
    def elapsed(self) -> float:
        """The latest ``time`` recorded (0 before the first update)."""
        return self._time[-1] if self._time else 0.0

    def reset(self) -> None:
        """Forget every recorded value (a new stage starts)."""
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()
