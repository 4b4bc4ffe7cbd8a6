"""The Launcher contract: how a parallel strategy turns one call into one call per rank.

The Trainer never starts processes itself. When ``strategy.launcher`` is set, it hands the stage
function to ``launcher.launch``, which arranges for every rank to run it (re-running the script,
spawning or forking workers, or simply calling it when a scheduler already started the ranks).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

__all__ = ["Launcher"]


class Launcher(ABC):
    """Starts the processes of a job and runs a function in each."""

    @property
    @abstractmethod
    def is_interactive_compatible(self) -> bool:
        """Whether this launcher works in a notebook / REPL, where there is no script to re-run."""

    @abstractmethod
    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on every rank and return the local result.

        Args:
            function: The work of one rank (the Trainer passes its stage runner).
            *args: Positional arguments for ``function``.
            trainer: The Trainer, when there is one: launchers that run ranks in other processes
                use it to bring results (weights, metrics, checkpoint paths) back to this process.
            **kwargs: Keyword arguments for ``function``.
        """

    def kill(self, signum: int) -> None:  # noqa: B027 - optional hook
        """Send ``signum`` to the processes this launcher started (used on Ctrl-C / fatal errors)."""
