"""Normalise the many spellings of ``Trainer(precision=...)`` to one canonical name.

Lightning accepts ``32``, ``"16"``, ``"bf16"`` and more; users copy those from old scripts. Keeping
the alias table in one place means the registry only knows canonical names and every error lists
the same valid choices.
"""

from __future__ import annotations

from collections.abc import Iterable

from phalanx.errors import MisconfigurationError, closest_match

__all__ = ["CANONICAL_PRECISIONS", "normalize_precision"]

#: The precision names phalanx itself implements.
CANONICAL_PRECISIONS: tuple[str, ...] = (
    "32-true",
    "64-true",
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
)

_ALIASES: dict[str, str] = {
    "32": "32-true",
    "64": "64-true",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
}


def normalize_precision(value: str | int, *, extra_choices: Iterable[str] = ()) -> str:
    """Return the canonical name for a ``precision=`` value.

    Args:
        value: A canonical name, an alias (``32``, ``"32"``, ``64``, ``16``, ``"16"``, ``"bf16"``)
            or one of ``extra_choices``.
        extra_choices: Further names accepted as-is, e.g. precisions registered by plugins.

    Returns:
        The canonical name, or ``value`` unchanged when it is one of ``extra_choices``.

    Raises:
        MisconfigurationError: Unknown value; the message lists the valid values and the closest one.
    """
    extras = tuple(extra_choices)
    key = None if isinstance(value, bool) or not isinstance(value, (str, int)) else str(value).strip()
    if key is not None:
        if key in CANONICAL_PRECISIONS or key in extras:
            return key
        if key in _ALIASES:
            return _ALIASES[key]
    choices = list(dict.fromkeys((*CANONICAL_PRECISIONS, *extras)))
    hint = closest_match(str(value), choices)
    suggestion = f" Did you mean {hint!r}?" if hint else ""
    msg = (
        f"precision={value!r} is not supported. Valid values are {choices} (aliases: 32, 64, 16, "
        f"'bf16').{suggestion} Pass one of them, e.g. precision='bf16-mixed'."
    )
    raise MisconfigurationError(msg)
