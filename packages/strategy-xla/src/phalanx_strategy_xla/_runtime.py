"""Questions about the torch-xla runtime, answered without starting it where possible.

torch-xla's launcher refuses to run once this process has touched an XLA device ("Runtime is
already initialized"), and on a TPU host the parent process must not hold the chips its workers
need. So counting devices before launching reads what the runtime *would* see (environment
variables, PCI devices) instead of asking the runtime itself, exactly as torch-xla does for
``xmp.spawn``.
"""

from __future__ import annotations

import os
from typing import Any

from phalanx.errors import MisconfigurationError, PluginUnavailableError

__all__ = [
    "device_type",
    "import_torch_xla",
    "runtime_initialized",
    "visible_device_count",
]

_INSTALL = "pip install 'phalanx-strategy-xla[xla]' (torch-xla pins torch: torch-xla 2.9.0 needs torch==2.9.0)"


def import_torch_xla(what: str) -> Any:
    """Import ``torch_xla`` or raise an error naming ``what`` needed it and how to install it.

    Raises:
        PluginUnavailableError: torch-xla is not importable in this environment.
    """
    try:
        import torch_xla
    except ImportError as err:
        msg = f"{what} needs torch-xla, which cannot be imported here ({err}); fix: {_INSTALL}"
        raise PluginUnavailableError(msg) from err
    return torch_xla


def device_type() -> str:
    """The PJRT device type torch-xla will use ("TPU", "CPU", "CUDA", ...), selecting its default.

    Lets torch-xla pick its own default (TPU when libtpu and chips are present, else CPU) when
    ``PJRT_DEVICE`` is unset, so phalanx never disagrees with the runtime about the hardware.
    """
    import_torch_xla("Querying the XLA device type")
    import torch_xla.runtime as xr

    xr._maybe_select_default_device()
    return str(xr.device_type() or "CPU").upper()


def runtime_initialized() -> bool:
    """Whether this process already started the XLA runtime (touched an XLA device)."""
    torch_xla = import_torch_xla("Checking the XLA runtime")
    return bool(torch_xla._XLAC._xla_runtime_is_initialized())


def _env_count(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        msg = f"{name}={value!r} is not a number of devices; set it to a positive integer such as {name}=2, or unset it."
        raise MisconfigurationError(msg) from None


def visible_device_count() -> int:
    """How many XLA devices this host's runtime will expose, without starting it when avoidable.

    CPU: ``CPU_NUM_DEVICES`` (default 1). TPU: chips on the PCI bus times cores per chip. CUDA:
    ``GPU_NUM_DEVICES`` or the number of CUDA devices. Anything else (plugins, Neuron) asks the
    runtime, which starts it in this process.
    """
    kind = device_type()
    if runtime_initialized():
        import torch_xla.runtime as xr

        return int(xr.global_runtime_device_count()) if xr.is_spmd() else int(xr.addressable_device_count())
    if kind == "CPU":
        count = _env_count("CPU_NUM_DEVICES")
        return 1 if count is None else count
    if kind == "TPU":
        from torch_xla._internal import tpu

        return int(tpu.num_available_devices())
    if kind in ("CUDA", "GPU"):
        count = _env_count("GPU_NUM_DEVICES")
        if count is not None:
            return count
        import torch

        return int(torch.cuda.device_count())
    import torch_xla.runtime as xr

    return int(xr.global_runtime_device_count())
