"""Every test must leave no process, listening port or environment variable behind."""

from __future__ import annotations

import sys
from pathlib import Path

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind"]

# The runs' shared model (scripts/ray_case.py) is read by the tests too.
_SCRIPTS = str(Path(__file__).parent / "scripts")
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)
