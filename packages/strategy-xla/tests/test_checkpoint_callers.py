"""Every replica of an XLA strategy calls its checkpoint IO on save, not rank 0 alone.

XLACheckpointIO moves tensors off each replica's devices and meets the replicas at a rendezvous;
a sharded save writes each host's shards. The core's default save (rank 0 calls the IO) would
leave the other hosts of a multi-host ``xla`` or ``xla_fsdp`` run out of that rendezvous: a hang.
Checked on a rank other than 0, without torch-xla (the strategies' save path needs none of it).
"""

from __future__ import annotations

from typing import Any

import pytest

from phalanx_strategy_xla.single_device import SingleDeviceXLAStrategy
from phalanx_strategy_xla.spmd import XLAFSDPStrategy
from phalanx_strategy_xla.strategy import XLAStrategy


class RecordingIO:
    def __init__(self) -> None:
        self.saved: list[str] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str, storage_options: Any | None = None) -> None:
        self.saved.append(path)


@pytest.mark.parametrize("strategy_class", [XLAStrategy, XLAFSDPStrategy, SingleDeviceXLAStrategy])
def test_a_rank_other_than_zero_calls_the_checkpoint_io(strategy_class: type) -> None:
    on_rank_1 = type(f"{strategy_class.__name__}OnRank1", (strategy_class,), {"is_global_zero": False})
    strategy = object.__new__(on_rank_1)  # no torch-xla runtime: only the save path is exercised
    io = RecordingIO()
    strategy.checkpoint_io = io
    strategy.save_checkpoint({"state_dict": {}}, "epoch=0.ckpt")
    assert io.saved == ["epoch=0.ckpt"], f"{strategy_class.__name__} on rank 1 did not call its checkpoint IO"
