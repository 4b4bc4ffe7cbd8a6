"""The reliability tests compute their plain-PyTorch references with the scripts' model and data."""

from __future__ import annotations

import sys
from pathlib import Path

_SCRIPTS = str(Path(__file__).parent / "scripts")
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)
