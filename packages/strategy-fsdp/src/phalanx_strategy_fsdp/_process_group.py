"""Keep the process group of a sharded model alive until the interpreter exits.

A sharded module's parameters are DTensors bound to the process group; destroying it at the end of
``fit`` would leave the user's model unusable (no forward, no checkpoint, no ``trainer.test``).
The group is destroyed at exit instead, once per process.
"""

from __future__ import annotations

import atexit

import torch.distributed as dist

__all__ = ["destroy_process_group_at_exit"]

_registered = False


def _destroy() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def destroy_process_group_at_exit() -> None:
    """Register the destruction of the default process group at exit (idempotent)."""
    global _registered
    if not _registered:
        atexit.register(_destroy)
        _registered = True
