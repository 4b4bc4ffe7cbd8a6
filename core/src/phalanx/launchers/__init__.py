"""Launchers: how a parallel strategy gets one process per rank.

``SubprocessScriptLauncher`` re-runs the user's script (ddp); ``MultiProcessingLauncher`` spawns or
forks workers (ddp_spawn, ddp_fork, ddp_notebook). They live in the core because every
multi-process strategy (ddp, fsdp, deepspeed) launches one of these two ways.
"""

from __future__ import annotations

from phalanx.launchers.launcher import Launcher
from phalanx.launchers.multiprocessing import MultiProcessingLauncher, WorkerFailedError
from phalanx.launchers.subprocess_script import SubprocessScriptLauncher

__all__ = ["Launcher", "MultiProcessingLauncher", "SubprocessScriptLauncher", "WorkerFailedError"]
