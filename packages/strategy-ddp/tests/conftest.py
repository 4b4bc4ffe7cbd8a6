"""Every ddp test must leave no process, listening port or changed environment variable behind.

The check (``phalanx.testing.leaks``) finds every process a test started by a marker variable
they all inherit, re-executed ranks re-parented to init included.
"""

from __future__ import annotations

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind"]
