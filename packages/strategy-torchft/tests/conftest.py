"""Every torchft test must leave no process (groups, lighthouse), port or environment variable behind."""

from __future__ import annotations

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind"]
