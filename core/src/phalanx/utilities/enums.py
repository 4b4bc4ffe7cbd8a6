"""String enums that compare to plain strings, as Lightning's do (``trainer.state.fn == "fit"``).

Lightning's stage and option enums are ``str`` enums whose comparison ignores case, so code that
checks ``trainer.state.stage == "train"`` or ``gradient_clip_algorithm == "NORM"`` works whether it
holds the enum or the string. :class:`LightningEnum` is that base under Lightning's name; the
Trainer's own enums (:mod:`phalanx.trainer.states`) derive from it.

Torch-free and dependency-free: the Trainer's state record (at the bottom of the core's layers)
uses it.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

__all__ = ["GradClipAlgorithmType", "LightningEnum"]

_Source = Literal["key", "value", "any"]


class LightningEnum(str, Enum):
    """A ``str`` enum equal to any string that matches its value, ignoring case.

    The hash is the lower-cased value's, so a member and its string find the same dict entry.
    """

    @classmethod
    def from_str(cls, value: str, source: _Source = "key") -> LightningEnum:
        """The member whose name (``source="key"``), value (``"value"``) or either (``"any"``,
        names first) matches ``value``, ignoring case for names.

        Raises:
            ValueError: Nothing matches; the message lists what would.
        """
        if source in ("key", "any"):
            for name in cls.__members__:
                if name.lower() == value.lower():
                    return cls[name]
        if source in ("value", "any"):
            for name, member in cls.__members__.items():
                if member == value:
                    return cls[name]
        msg = f"{value!r} is not a {cls.__name__}: expected one of {cls._choices(source)}"
        raise ValueError(msg)

    @classmethod
    def try_from_str(cls, value: str, source: _Source = "key") -> LightningEnum | None:
        """Like :meth:`from_str`, but warn and return None when nothing matches."""
        import warnings

        try:
            return cls.from_str(value, source)
        except ValueError as error:
            warnings.warn(str(error), UserWarning, stacklevel=2)
        return None

    @classmethod
    def _choices(cls, source: str) -> list[str]:
        names = list(cls.__members__)
        values = [member.value for member in cls.__members__.values()]
        return names if source == "key" else values if source == "value" else names + values

    def __eq__(self, other: object) -> bool:
        other_value = other.value if isinstance(other, Enum) else other
        return bool(self.value.lower() == str(other_value).lower())

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.value.lower())


class GradClipAlgorithmType(LightningEnum):
    """``Trainer(gradient_clip_algorithm=...)``: clip the gradients' global norm, or each value."""

    VALUE = "value"
    NORM = "norm"

    @staticmethod
    def supported_type(val: str) -> bool:
        """Whether ``val`` is one of the values (case-sensitive, as Lightning checks it)."""
        return any(member.value == val for member in GradClipAlgorithmType)

    @staticmethod
    def supported_types() -> list[str]:
        """The accepted values."""
        return [member.value for member in GradClipAlgorithmType]
