"""What an optimizer keeps and what its step allocates for a moment, per kind, in bytes.

Public through :mod:`phalanx.memory` (``OPTIMIZER_STATE_BYTES``, ``optimizer_state_bytes``,
``optimizer_step_bytes``), where every strategy plugin's estimate uses them.
"""

from __future__ import annotations

from phalanx.errors import MisconfigurationError, closest_match

__all__ = [
    "FOREACH_DEVICE_TYPES",
    "OPTIMIZER_STATE_BYTES",
    "OPTIMIZER_STEP_TEMPORARIES",
    "optimizer_state_bytes",
    "optimizer_step_bytes",
]

#: Optimizer kind -> float32 state bytes per trainable element (Adam: exp_avg + exp_avg_sq).
OPTIMIZER_STATE_BYTES: dict[str, int] = {
    "adamw": 8,
    "adam": 8,
    "sgd": 0,
    "sgd_momentum": 4,
    "rmsprop": 4,
    "adagrad": 4,
    "lion": 4,
    "none": 0,
}


def optimizer_state_bytes(optimizer: str, numel: int, *, state_dtype_bytes: int = 4) -> int:
    """Bytes of optimizer state for ``numel`` trainable elements.

    ``state_dtype_bytes`` is the element size of the state (4: float32; 8 for 64-true); Adam also
    keeps one scalar ``step`` per tensor, which is negligible and left out.

    Raises:
        MisconfigurationError: Unknown optimizer kind; names the valid ones.
    """
    if optimizer not in OPTIMIZER_STATE_BYTES:
        hint = closest_match(optimizer, OPTIMIZER_STATE_BYTES)
        msg = (
            f"optimizer {optimizer!r} has no known state size; valid kinds are {sorted(OPTIMIZER_STATE_BYTES)}"
            f"{f' (closest: {hint!r})' if hint else ''}. Pass one of them, e.g. --optimizer adamw."
        )
        raise MisconfigurationError(msg)
    return OPTIMIZER_STATE_BYTES[optimizer] * numel * state_dtype_bytes // 4


#: Optimizer kind -> the temporaries its step allocates, in tensors of the state dtype: (per element
#: of all its tensors with the multi-tensor "foreach" path, per element of its largest tensor with the
#: one-tensor-at-a-time path). Adam's one-tensor step makes ``exp_avg_sq.sqrt()`` and its quotient by
#: the bias correction (two temporaries); its foreach step one square root over every tensor;
#: RMSprop, Adagrad and Lion one; SGD updates in place.
OPTIMIZER_STEP_TEMPORARIES: dict[str, tuple[int, int]] = {
    "adamw": (1, 2),
    "adam": (1, 2),
    "sgd": (0, 0),
    "sgd_momentum": (0, 0),
    "rmsprop": (1, 1),
    "adagrad": (1, 1),
    "lion": (1, 1),
    "none": (0, 0),
}

#: Device types on which torch's optimizers default to their foreach path (elsewhere, e.g. on CPU,
#: they step one tensor at a time).
FOREACH_DEVICE_TYPES = ("cuda", "xpu", "hpu", "mtia")


def optimizer_step_bytes(
    optimizer: str, tensors: list[int], *, device_type: str = "cuda", state_dtype_bytes: int = 4
) -> int:
    """Bytes the optimizer step allocates for a moment, over trainable tensors of ``tensors`` elements.

    torch's optimizers take their foreach path on CUDA-like devices (temporaries for every tensor
    at once) and step one tensor at a time elsewhere (temporaries for the largest tensor only).
    They exist while the step runs, after backward freed the activations, so
    :attr:`MemoryEstimate.total` counts the larger of the two.

    Raises:
        MisconfigurationError: Unknown optimizer kind; names the valid ones.
    """
    optimizer_state_bytes(optimizer, 0)  # the one place that names the valid kinds
    foreach, single = OPTIMIZER_STEP_TEMPORARIES[optimizer]
    if not tensors:
        return 0
    if device_type in FOREACH_DEVICE_TYPES:
        return foreach * sum(tensors) * state_dtype_bytes
    return single * max(tensors) * state_dtype_bytes
