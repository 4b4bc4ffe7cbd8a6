"""Turn a sharded ``xla_fsdp`` checkpoint folder into one portable torch file.

Reading the folder needs torch (``torch.distributed.checkpoint``) but not torch-xla, so a
checkpoint trained on a TPU converts on any machine with this plugin installed.
"""

from __future__ import annotations

from pathlib import Path

from phalanx.utilities import write_portable_checkpoint
from phalanx_strategy_xla.checkpoint_io import load_sharded_to_cpu

__all__ = ["convert_sharded_checkpoint"]


def convert_sharded_checkpoint(source: str, destination: str) -> None:
    """Read every shard of ``source`` onto the CPU and write the portable file ``destination``."""
    checkpoint = load_sharded_to_cpu(Path(source))
    write_portable_checkpoint(checkpoint["state_dict"], destination, source=source, extra=checkpoint)
