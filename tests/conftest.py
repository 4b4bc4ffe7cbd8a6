"""Every integration test must leave no process, listening port or env change behind.

The check is ``phalanx.testing.leaks``; it applies to every folder under ``tests/``.
"""

from __future__ import annotations

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind"]
