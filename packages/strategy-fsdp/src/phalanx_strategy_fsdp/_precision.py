"""From the Trainer's precision to FSDP2's MixedPrecisionPolicy, and what CPU offload can serve.

FSDP2 does mixed precision itself: it all-gathers parameters in ``param_dtype`` for compute and
reduce-scatters gradients in ``reduce_dtype``, while the sharded master weights (and therefore the
optimizer) stay in float32. That is cheaper than autocast alone, because the all-gather moves half
the bytes, so the ``*-mixed`` precisions map onto it. The ``*-true`` precisions already cast the
module itself (``Precision.convert_module``), so FSDP needs no casting for them.
"""

from __future__ import annotations

from typing import Any

import torch

from phalanx.errors import MisconfigurationError
from phalanx_strategy_fsdp._fsdp2 import MixedPrecisionPolicy

__all__ = ["OFFLOAD_UNSUPPORTED", "check_offload_precision", "mixed_precision_policy"]

#: Mixed precisions whose FSDP2 policy computes in a 16-bit type but reduces gradients in float32:
#: summing many small 16-bit gradients across ranks in 16 bits would lose precision.
_MIXED = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}

#: Precisions CPU offload cannot serve, with the reason shown to the user.
OFFLOAD_UNSUPPORTED = {
    "16-mixed": (
        "16-mixed needs a GradScaler, which unscales and inf-checks the gradients on the compute device "
        "and skips steps by consensus over ranks; with cpu_offload=True FSDP moves every gradient shard "
        "to CPU memory before the optimizer sees it, so the scaler would run on CPU tensors outside its "
        "device and force a host synchronisation per step"
    ),
}


def precision_name(precision_plugin: Any) -> str:
    """The canonical name of a precision plugin (``"32-true"`` for unknown custom plugins)."""
    return str(getattr(precision_plugin, "precision", "32-true"))


def mixed_precision_policy(precision_plugin: Any, override: Any | None) -> MixedPrecisionPolicy:
    """The policy to pass to ``fully_shard``: the user's own, else one derived from the precision.

    Raises:
        MisconfigurationError: ``override`` is not a ``MixedPrecisionPolicy``.
    """
    if override is not None:
        if not isinstance(override, MixedPrecisionPolicy):
            msg = (
                f"FSDPStrategy(mixed_precision={override!r}) has type {type(override).__name__}; pass a "
                "torch.distributed.fsdp.MixedPrecisionPolicy, or None to derive it from Trainer(precision=...)."
            )
            raise MisconfigurationError(msg)
        return override
    dtype = _MIXED.get(precision_name(precision_plugin))
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def check_offload_precision(precision_plugin: Any, *, cpu_offload: bool) -> None:
    """Refuse a precision CPU offload cannot serve, when the strategy is configured (not mid-run).

    Raises:
        MisconfigurationError: Naming the precision, why, and the working choices.
    """
    name = precision_name(precision_plugin)
    if not cpu_offload or name not in OFFLOAD_UNSUPPORTED:
        return
    msg = (
        f"FSDPStrategy(cpu_offload=True) cannot serve precision={name!r}: {OFFLOAD_UNSUPPORTED[name]}. "
        "Fix: use precision='bf16-mixed' (no loss scaling needed) or '32-true' with CPU offload, or keep "
        f"{name!r} and use strategy='fsdp' without offload."
    )
    raise MisconfigurationError(msg)
