"""The ``xla`` plugin's hook implementations: names, descriptions and the "auto" choices.

Imports neither torch nor torch_xla: ``phalanx strategies`` runs these hooks and must stay fast and
work where torch-xla is not installed. Every name requires ``torch-xla``, so without it the names
are listed as unavailable with the install command, and selecting one raises that message.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from phalanx import hookimpl
from phalanx.utilities import installed_version

if TYPE_CHECKING:
    from phalanx.memory import MemoryEstimate, MemoryRequest
    from phalanx.registry import Registry

__all__ = [
    "SHARDED_MARKER",
    "phalanx_convert_checkpoint",
    "phalanx_estimate_memory",
    "phalanx_register_accelerators",
    "phalanx_register_checkpoint_io",
    "phalanx_register_precisions",
    "phalanx_register_strategies",
    "phalanx_select_accelerator",
    "phalanx_select_strategy",
]

_PKG = "phalanx_strategy_xla"
#: File inside every sharded checkpoint folder this plugin writes (how convert recognises them).
SHARDED_MARKER = "phalanx_xla_sharded"
_REQUIRES = ("torch-xla>=2.1",)
#: Accelerator names this plugin answers the "auto" strategy question for.
_XLA_ACCELERATORS = ("xla", "tpu")


@hookimpl
def phalanx_register_strategies(registry: Registry) -> None:
    """Register single_xla, xla, xla_debug and the SPMD strategy xla_fsdp."""
    registry.register(
        "single_xla",
        f"{_PKG}.single_device:SingleDeviceXLAStrategy",
        "One XLA device (a TPU core, or XLA:CPU) in this process; graphs cut once per optimizer step",
        requires=_REQUIRES,
    )
    registry.register(
        "xla",
        f"{_PKG}.strategy:XLAStrategy",
        "One process per XLA device via torch-xla's launcher; gradients all-reduced by xm, MpDeviceLoader data",
        requires=_REQUIRES,
    )
    registry.register(
        "xla_debug",
        f"{_PKG}.strategy:XLAStrategy",
        "Like 'xla' with PT_XLA_DEBUG_LEVEL=1 and torch-xla's metrics report printed after each stage",
        requires=_REQUIRES,
        debug=True,
    )
    registry.register(
        "xla_fsdp",
        f"{_PKG}.spmd:XLAFSDPStrategy",
        "SPMD in one process: a device mesh, inputs sharded along 'fsdp', parameters sharded FSDP-style (FSDPv2)",
        requires=_REQUIRES,
    )


@hookimpl
def phalanx_register_accelerators(registry: Registry) -> None:
    """Register the XLA accelerator as ``xla`` and, as Lightning users spell it, ``tpu``."""
    target = f"{_PKG}.accelerator:XLAAccelerator"
    registry.register("xla", target, "XLA devices through torch-xla's PJRT runtime (TPU, or CPU for tests)", requires=_REQUIRES)
    registry.register("tpu", target, "Alias of xla", requires=_REQUIRES)


@hookimpl
def phalanx_register_precisions(registry: Registry) -> None:
    """Register the XLA precisions under names that do not collide with the core's."""
    target = f"{_PKG}.precision:XLAPrecision"
    registry.register(
        "xla-bf16-true", target, "bfloat16 weights and compute on XLA", requires=_REQUIRES, precision="bf16-true"
    )
    registry.register(
        "xla-bf16-mixed",
        target,
        "float32 weights, bfloat16 autocast on XLA",
        requires=_REQUIRES,
        precision="bf16-mixed",
    )


@hookimpl
def phalanx_register_checkpoint_io(registry: Registry) -> None:
    """Register the XLA checkpoint IO: one file from the master ordinal, or a sharded DCP folder."""
    target = f"{_PKG}.checkpoint_io:XLACheckpointIO"
    registry.register("xla", target, "Tensors to CPU, one torch file written by the master ordinal", requires=_REQUIRES)
    registry.register(
        "xla_sharded",
        target,
        "torch.distributed.checkpoint folder of sharded XLA tensors (SPMD)",
        requires=_REQUIRES,
        sharded=True,
    )


@hookimpl
def phalanx_select_accelerator() -> str | None:
    """``"xla"`` when torch-xla is installed and its runtime is meant to be used here.

    That is: ``PJRT_DEVICE`` names a device type (the user opted in), or a TPU is attached. The
    installed-metadata check comes first so that ``accelerator="auto"`` costs nothing on machines
    without torch-xla; torch_xla is imported only when both checks say it could be used.
    """
    if installed_version("torch-xla") is None:
        return None
    if not os.environ.get("PJRT_DEVICE") and not _tpu_attached():
        return None
    from phalanx_strategy_xla._runtime import visible_device_count

    try:
        return "xla" if visible_device_count() > 0 else None
    except Exception:
        return None


@hookimpl
def phalanx_select_strategy(accelerator: str, num_devices: int, num_nodes: int, interactive: bool) -> str | None:
    """On XLA: ``single_xla`` for one device, ``xla`` (one process per device) for several."""
    del interactive  # torch-xla's launcher forks, which works in notebooks too
    if accelerator not in _XLA_ACCELERATORS:
        return None
    return "single_xla" if num_devices * num_nodes <= 1 else "xla"


@hookimpl
def phalanx_convert_checkpoint(source: str, destination: str) -> bool | None:
    """A sharded ``xla_fsdp`` folder becomes one portable torch file; anything else is passed on.

    Reading the folder needs torch (``torch.distributed.checkpoint``) but not torch-xla, so a
    checkpoint trained on a TPU converts on any machine with this plugin installed.
    """
    if not os.path.isfile(os.path.join(source, SHARDED_MARKER)):
        return None
    from phalanx_strategy_xla._convert import convert_sharded_checkpoint

    convert_sharded_checkpoint(source, destination)
    return True


def _tpu_attached() -> bool:
    """Whether libtpu is installed and the host exposes TPU chips (``/dev/accel*``, ``/dev/vfio/<n>``).

    Judged without importing anything, the way torch-xla itself looks for chips.
    """
    if installed_version("libtpu") is None and installed_version("libtpu-nightly") is None:
        return False
    try:
        if any(name.startswith("accel") for name in os.listdir("/dev")):
            return True
        return any(name.isdigit() for name in os.listdir("/dev/vfio"))
    except OSError:
        return False


@hookimpl
def phalanx_estimate_memory(request: MemoryRequest) -> MemoryEstimate | None:
    """single_xla / xla: a replica per device; xla_fsdp: an SPMD shard per device."""
    from phalanx_strategy_xla._memory import estimate

    return estimate(request)
