"""The single-device estimate: everything on one device, nothing communicated."""

from __future__ import annotations

from phalanx.memory import MemoryEstimate, MemoryRequest, replicated_estimate

__all__ = ["TARGET", "estimate"]

TARGET = "phalanx.strategies.single_device:SingleDeviceStrategy"


def estimate(request: MemoryRequest) -> MemoryEstimate | None:
    """A full copy of weights, gradients and optimizer state on the one device."""
    if request.target != TARGET:
        return None
    return replicated_estimate(request, layout="1 device")
