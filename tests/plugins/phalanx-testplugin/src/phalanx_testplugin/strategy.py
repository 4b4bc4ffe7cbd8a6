"""Components of the test plugin: thin, observable subclasses of the core's own."""

from __future__ import annotations

from typing import Any

from phalanx.checkpoint_io import TorchCheckpointIO
from phalanx.strategies import SingleDeviceStrategy


class CountingStrategy(SingleDeviceStrategy):
    """A single-device strategy that counts the optimizer steps it performs."""

    strategy_name = "counting_single_device"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps = 0

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        self.steps += 1
        return super().optimizer_step(*args, **kwargs)


class CountingCheckpointIO(TorchCheckpointIO):
    """torch checkpoint IO that counts saves."""

    def __init__(self) -> None:
        super().__init__()
        self.saves = 0

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.saves += 1
        super().save_checkpoint(*args, **kwargs)
