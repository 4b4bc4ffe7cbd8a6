"""The Accelerator: what a strategy needs to know about one kind of hardware.

A strategy decides *how* work is spread; the accelerator answers *where*: whether the hardware is
present, how many devices there are, how a user's ``devices=`` argument maps to concrete
``torch.device`` objects, and how to prepare and release a device. Keeping that apart lets one
strategy (DDP, say) run unchanged on CPU processes or on GPUs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from phalanx.errors import MisconfigurationError

__all__ = ["Accelerator", "DevicesArg"]

#: Everything a user may pass as ``devices=``.
DevicesArg = int | str | list[int] | tuple[int, ...]

_ACCEPTED = 'a positive int, -1 (all), "auto", a count string like "2", or indices like "0,1" / [0, 1]'


class Accelerator(ABC):
    """Base class of every accelerator (cpu, cuda, mps, and those plugins register).

    Subclasses set :attr:`name` (the registry name) and implement the hardware queries. The
    ``devices=`` parsing is shared here so every accelerator accepts the same spellings and fails
    with the same kind of message.
    """

    #: Registry name, e.g. ``"cuda"``; also the ``torch.device`` type for built-in accelerators.
    name: ClassVar[str] = ""

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` the current device of this process.

        Called once per process by the strategy's ``setup_environment``, before the model is built,
        so that libraries allocating on "the current device" pick the right one. The default only
        checks the device type matches this accelerator.

        Raises:
            MisconfigurationError: ``device`` belongs to another kind of hardware.
        """
        if self.name and device.type != self.name:
            msg = (
                f"{type(self).__name__} cannot use device {str(device)!r}; it only drives "
                f"{self.name!r} devices. Pass a {self.name} device or pick the accelerator matching "
                f"{device.type!r}."
            )
            raise MisconfigurationError(msg)

    def setup(self, trainer: Any = None) -> None:  # noqa: B027 - optional hook, no-op by default
        """Prepare the accelerator for a run of ``trainer`` (e.g. backend flags). No-op by default."""

    def teardown(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Release what :meth:`setup` acquired (cached memory, handles). No-op by default."""

    @staticmethod
    @abstractmethod
    def is_available() -> bool:
        """Whether this hardware can be used in this process."""

    @staticmethod
    @abstractmethod
    def auto_device_count() -> int:
        """How many devices ``devices="auto"`` means (and the most that may be requested)."""

    @classmethod
    def parse_devices(cls, devices: DevicesArg) -> int | list[int]:
        """Turn a user's ``devices=`` value into device indices.

        Accepted: a positive int ``n`` (the first ``n`` devices), ``-1`` or ``"-1"`` (all devices),
        ``"auto"``, a count string ``"2"``, an index string ``"0,1"`` (``"1,"`` selects index 1),
        or a list/tuple of indices. Enumerable accelerators return indices so that
        :meth:`get_parallel_devices` can address each device; CPU overrides this to return a
        process count.

        Raises:
            MisconfigurationError: The value has an unknown form, asks for zero devices, repeats an
                index, or asks for more devices than are available.
        """
        request = _parse_request(devices, what=cls.name or cls.__name__)
        available = cls.auto_device_count()
        if available < 1:
            msg = (
                f"devices={devices!r} asks for {cls.name} devices but none is available in this "
                'process; use accelerator="cpu" (or "auto"), or run where the hardware is visible.'
            )
            raise MisconfigurationError(msg)
        if isinstance(request, int):
            count = available if request == -1 else request
            if count > available or count < 1:
                msg = (
                    f"devices={devices!r} asks for {count} {cls.name} device(s) but only {available} "
                    f"{'is' if available == 1 else 'are'} available; pass devices={max(available, 1)} "
                    'or fewer, or devices="auto".'
                )
                raise MisconfigurationError(msg)
            return list(range(count))
        out_of_range = [index for index in request if index >= available]
        if out_of_range:
            msg = (
                f"devices={devices!r} selects {cls.name} index {out_of_range[0]} but the valid indices are "
                f"{list(range(available))}; pick indices from that list."
            )
            raise MisconfigurationError(msg)
        return request

    @classmethod
    def get_parallel_devices(cls, devices: DevicesArg) -> list[torch.device]:
        """The ``torch.device`` each process will use, one entry per process.

        ``devices`` may be a raw ``devices=`` value or the output of :meth:`parse_devices`.
        """
        parsed = cls.parse_devices(devices)
        indices = list(range(parsed)) if isinstance(parsed, int) else parsed
        return [torch.device(cls.name, index) for index in indices]

    def get_device_stats(self, device: torch.device | str | int) -> dict[str, Any]:
        """Numbers worth logging about ``device`` (memory use, utilisation); empty by default."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _parse_request(devices: Any, *, what: str) -> int | list[int]:
    """Syntax-only parsing shared by accelerators: a count (``-1`` = all) or a list of indices."""
    if isinstance(devices, bool):
        msg = f"devices={devices!r} is not valid for {what}; pass {_ACCEPTED}."
        raise MisconfigurationError(msg)
    if isinstance(devices, str):
        text = devices.strip().lower()
        if text == "auto":
            return -1
        if "," in text:
            parts = [part.strip() for part in text.split(",") if part.strip()]
            if not parts or not all(part.isdigit() for part in parts):
                msg = f"devices={devices!r} is not a valid index list for {what}; pass {_ACCEPTED}."
                raise MisconfigurationError(msg)
            return _check_indices([int(part) for part in parts], devices, what)
        try:
            devices = int(text)
        except ValueError:
            msg = f"devices={devices!r} is not valid for {what}; pass {_ACCEPTED}."
            raise MisconfigurationError(msg) from None
    if isinstance(devices, int):
        if devices == -1 or devices >= 1:
            return devices
        msg = f"devices={devices!r} is not valid for {what}: at least one device is needed. Pass {_ACCEPTED}."
        raise MisconfigurationError(msg)
    if isinstance(devices, (list, tuple)):
        if not devices or not all(isinstance(i, int) and not isinstance(i, bool) for i in devices):
            msg = f"devices={devices!r} is not a valid index list for {what}; pass {_ACCEPTED}."
            raise MisconfigurationError(msg)
        return _check_indices(list(devices), devices, what)
    msg = f"devices={devices!r} (type {type(devices).__name__}) is not valid for {what}; pass {_ACCEPTED}."
    raise MisconfigurationError(msg)


def _check_indices(indices: list[int], original: Any, what: str) -> list[int]:
    negative = [index for index in indices if index < 0]
    if negative:
        msg = f"devices={original!r} contains the negative index {negative[0]} for {what}; indices start at 0."
        raise MisconfigurationError(msg)
    if len(set(indices)) != len(indices):
        msg = f"devices={original!r} repeats an index for {what}; list each device once, e.g. [0, 1]."
        raise MisconfigurationError(msg)
    return indices
