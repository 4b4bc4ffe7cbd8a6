"""What ``Trainer(...)`` resolves to when several devices are asked for and this plugin is installed.

Moved here from the core's connector tests: the core's session installs no plugin, so there these
checks could only take the "not installed" branch. Tests whose names end in ``_fake_hardware``
register an accelerator that pretends to have four devices (each is really the CPU): the only
place the project allows faking hardware counts. Nothing here starts a process.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch

from phalanx import Trainer
from phalanx.accelerators import Accelerator
from phalanx.errors import MisconfigurationError
from phalanx.launchers import MultiProcessingLauncher, SubprocessScriptLauncher
from phalanx.registry import AcceleratorRegistry
from phalanx.strategies import DDPStrategy, SingleDeviceStrategy

_QUIET: dict[str, Any] = {"enable_progress_bar": False, "logger": False, "enable_checkpointing": False}


class FourDevices(Accelerator):
    """Pretends to have four devices (each is really the CPU)."""

    name: ClassVar[str] = "cpu"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 4

    @classmethod
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:
        parsed = cls.parse_devices(devices)
        return [torch.device("cpu")] * (parsed if isinstance(parsed, int) else len(parsed))


@pytest.fixture
def fake4(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delattr(sys, "ps1", raising=False)  # pytest under an interactive shell must not pick ddp_notebook
    AcceleratorRegistry.register("fake4", FourDevices, description="test double with 4 devices")
    yield "fake4"
    AcceleratorRegistry.remove("fake4")


@pytest.mark.parametrize(
    ("devices", "count"), [("auto", 4), (-1, 4), (2, 2), ([1, 3], 2), ("0,1,2", 3), ("1,", 1), ("3", 3)]
)
def test_devices_spellings_resolve_to_ddp_fake_hardware(fake4: str, devices: Any, count: int) -> None:
    trainer = Trainer(accelerator=fake4, devices=devices, **_QUIET)
    assert trainer.num_devices == count
    if count == 1:
        assert type(trainer.strategy) is SingleDeviceStrategy
        return
    strategy = trainer.strategy
    assert type(strategy) is DDPStrategy and strategy.start_method == "popen"
    assert len(strategy.parallel_devices) == count
    assert isinstance(strategy.launcher, SubprocessScriptLauncher)
    assert strategy.launcher.num_processes == count


def test_two_cpu_processes_without_a_strategy_mean_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sys, "ps1", raising=False)
    strategy = Trainer(accelerator="cpu", devices=2, **_QUIET).strategy
    assert type(strategy) is DDPStrategy and strategy.start_method == "popen"
    assert strategy.parallel_devices == [torch.device("cpu")] * 2
    assert isinstance(strategy.launcher, SubprocessScriptLauncher) and strategy.launcher.num_processes == 2


def test_interactive_session_picks_ddp_notebook_and_refuses_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)  # what makes an interpreter interactive
    strategy = Trainer(accelerator="cpu", devices=2, **_QUIET).strategy
    assert type(strategy) is DDPStrategy and strategy.start_method == "fork"
    assert isinstance(strategy.launcher, MultiProcessingLauncher) and strategy.launcher.is_interactive_compatible
    with pytest.raises(MisconfigurationError, match="interactive"):
        Trainer(strategy="ddp", accelerator="cpu", devices=2, **_QUIET)
