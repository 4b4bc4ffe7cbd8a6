"""Shared setup: XLA runs on the CPU (``PJRT_DEVICE=CPU``) unless the caller chose a device type.

Set before torch_xla is first imported (it reads the variable then). Tests that need torch-xla
skip through ``pytest.importorskip`` where it is missing -- except in the ``xla`` session, which
sets ``PHALANX_REQUIRE_TORCH_XLA=1``: there those skips fail (``xla_required.py``). Every test
must leave no process, listening port or env change behind (``phalanx.testing.leaks``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
sys.path.insert(0, str(Path(__file__).parent))

from xla_required import pytest_make_collect_report, pytest_runtest_makereport

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind", "pytest_make_collect_report", "pytest_runtest_makereport"]
