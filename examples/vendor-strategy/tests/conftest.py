"""Every test must leave no process, listening port or env change behind (``phalanx.testing.leaks``)."""

from __future__ import annotations

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind"]
