"""Error types phalanx raises on purpose.

Every message names the bad value, the valid choices (or the closest match) and the fix, so a
user never has to read phalanx's source to recover. The classes double-inherit from the builtin
exception a caller would naturally catch (``ValueError``, ``KeyError``, ``ImportError``).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "CheckpointError",
    "CollectiveMismatchError",
    "MisconfigurationError",
    "PhalanxError",
    "PluginHookError",
    "PluginUnavailableError",
    "SIGTERMException",
    "UnknownNameError",
    "closest_match",
]


class PhalanxError(Exception):
    """Base class of every error phalanx raises deliberately."""


class MisconfigurationError(PhalanxError, ValueError):
    """An argument or setting has a value phalanx cannot work with."""


class UnknownNameError(MisconfigurationError, KeyError):
    """A name that no registry knows.

    ``KeyError`` wraps its message in quotes when printed; ``__str__`` undoes that so the message
    reads as prose.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class PluginUnavailableError(PhalanxError, ImportError):
    """The name is known but cannot be used in this environment (missing package, broken plugin)."""


class PluginHookError(PhalanxError, RuntimeError):
    """A plugin's hook implementation raised; the message names the plugin and how to block it."""


class CheckpointError(PhalanxError, ValueError):
    """A checkpoint is missing, unreadable or belongs to another model."""


class SIGTERMException(SystemExit):
    """The job was told to stop (SIGTERM, or the scheduler's warning signal) and the run ends here.

    Lightning's name and base class: a ``SystemExit``, so an ``except Exception`` in user code does
    not swallow it and, unhandled, it ends the process with its code (143 after a preemption
    checkpoint). ``Callback.on_exception`` sees it like any other exception that ends a stage.
    """


class CollectiveMismatchError(PhalanxError, RuntimeError):
    """Ranks issued different collectives at the same point (``PHALANX_DISTRIBUTED_DEBUG=1`` checks)."""


def closest_match(value: str, choices: Iterable[str]) -> str | None:
    """Return the choice most similar to ``value`` or ``None`` when nothing is close."""
    import difflib  # imported when an error is being written, not with phalanx

    matches = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None
