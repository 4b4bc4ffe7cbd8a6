"""Shared setup: XLA runs on the CPU (``PJRT_DEVICE=CPU``) unless the caller chose a device type.

Set before torch_xla is first imported (it reads the variable then). Tests that need torch-xla
skip through ``pytest.importorskip``; the listing tests run in environments without it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
sys.path.insert(0, str(Path(__file__).parent))
