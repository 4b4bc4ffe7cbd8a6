"""Accelerators with one real bug each; the accelerator kit must fail every one of them."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import torch

from phalanx.accelerators import Accelerator
from phalanx.accelerators.cpu import CPUAccelerator

_HANDLES: list[Any] = []


class NamelessAccelerator(CPUAccelerator):
    """Forgets to set ``name``: the registry name and the device type it drives are unknown."""

    name: ClassVar[str] = ""


class EnvSettingAccelerator(CPUAccelerator):
    """Pins the visible devices while merely being asked whether it is there."""

    @staticmethod
    def is_available() -> bool:
        os.environ["PHALANX_KIT_VISIBLE_DEVICES"] = "0"
        return True


class DeviceOpeningAccelerator(CPUAccelerator):
    """Opens its device node to answer is_available, and keeps it open (a runtime brought up early)."""

    @staticmethod
    def is_available() -> bool:
        if not _HANDLES:
            _HANDLES.append(open(os.devnull, "rb"))  # noqa: SIM115 - the bug: a handle kept open
        return True


class CountIgnoringAccelerator(CPUAccelerator):
    """Always gives one device, whatever ``devices=`` asked for."""

    @classmethod
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:
        cls.parse_devices(devices)
        return [torch.device("cpu")]


class MetaAccelerator(Accelerator):
    """Reports devices where tensors hold no data: nothing computed there is real."""

    name: ClassVar[str] = "meta"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 1


class DtypeChangingAccelerator(CPUAccelerator):
    """Switches torch to float64 for the whole process when a run starts, and never switches back."""

    def setup(self, trainer: Any = None) -> None:
        torch.set_default_dtype(torch.float64)
