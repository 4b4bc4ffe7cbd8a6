"""Helpers shared by the ddp test modules (a uniquely named module: several packages' tests run together)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from phalanx.testing.processes import Job

__all__ = ["SCRIPTS", "load_json", "start_job"]

SCRIPTS = Path(__file__).parent / "scripts"


def start_job(workdir: Path, name: str, *args: str, env: dict[str, str] | None = None) -> Job:
    """Start ``python SCRIPT args`` (a tests/scripts file) or ``python -m ...`` as a marked job.

    ``OMP_NUM_THREADS=1`` like torchrun, so that every launch method computes with the same
    number of threads as the plain reference loop.
    """
    command = (
        [sys.executable, str(SCRIPTS / args[0]), *args[1:]] if args[0].endswith(".py") else [sys.executable, *args]
    )
    return Job(command, workdir, env={"OMP_NUM_THREADS": "1", **(env or {})}, name=name, warm=True)


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())
