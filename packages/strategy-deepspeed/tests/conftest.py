"""Every test must leave no process, listening port, process group or environment variable behind.

The check is ``phalanx.testing.leaks`` (ranks re-parented to init are found by a marker they all
inherit). Helpers for running the training script live in ``ds_helpers.py`` (a unique module
name, so the suites of several packages can be collected together).
"""

from __future__ import annotations

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind"]
