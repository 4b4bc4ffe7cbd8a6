"""``phalanx checkpoint convert`` for FSDP's sharded directories: the core's DCP format answers.

FSDP writes the core's sharded format (:mod:`phalanx.checkpoint_io.dcp`), which the core converts
itself; this module only forwards, for as long as the plugin still implements the conversion hook.
"""

from __future__ import annotations

__all__ = ["convert_sharded_checkpoint"]


def convert_sharded_checkpoint(source: str, destination: str) -> bool | None:
    """Write ``source`` (a sharded checkpoint) as a portable file; ``None`` for other formats."""
    from phalanx.checkpoint_io.dcp import convert_to_portable

    return convert_to_portable(source, destination)
