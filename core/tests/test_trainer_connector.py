"""How Trainer(...) resolves accelerator / strategy / devices / precision / plugins.

Tests whose names end in ``_fake_hardware`` register an accelerator that pretends to have devices:
the only place the project allows faking hardware counts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch
from trainer_helpers import quiet

from phalanx.accelerators.accelerator import Accelerator
from phalanx.checkpoint_io.torch_io import TorchCheckpointIO
from phalanx.errors import MisconfigurationError, PluginUnavailableError, UnknownNameError
from phalanx.registry import AcceleratorRegistry, StrategyRegistry
from phalanx.strategies.single_device import SingleDeviceStrategy
from phalanx.trainer.connector import is_interactive
from phalanx.trainer.trainer import Trainer


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
def fake4() -> Iterator[str]:
    AcceleratorRegistry.register("fake4", FourDevices, description="test double with 4 devices")
    yield "fake4"
    AcceleratorRegistry.remove("fake4")


def _ddp_available() -> bool:
    return "ddp" in StrategyRegistry and StrategyRegistry.entry("ddp").available


def test_auto_on_this_machine_is_single_device() -> None:
    trainer = Trainer(**quiet())
    assert isinstance(trainer.strategy, SingleDeviceStrategy)
    assert trainer.strategy.accelerator is not None
    assert trainer.precision == "32-true"
    assert (trainer.world_size, trainer.global_rank, trainer.is_global_zero) == (1, 0, True)


@pytest.mark.parametrize(
    ("devices", "count"), [("auto", 4), (-1, 4), (2, 2), ([1, 3], 2), ("0,1,2", 3), ("1,", 1), ("3", 3)]
)
def test_devices_spellings_fake_hardware(fake4: str, devices: Any, count: int) -> None:
    if count > 1 and not _ddp_available():
        with pytest.raises((PluginUnavailableError, UnknownNameError), match="phalanx-strategy-ddp"):
            Trainer(accelerator=fake4, devices=devices, **quiet())
        return
    trainer = Trainer(accelerator=fake4, devices=devices, **quiet())
    assert trainer.num_devices == count
    expected = "single_device" if count == 1 else "ddp"
    assert trainer._strategy_name == expected


@pytest.mark.parametrize("devices", [5, [4], "0,0", [-1]])
def test_devices_out_of_range_fake_hardware(fake4: str, devices: Any) -> None:
    with pytest.raises(MisconfigurationError, match="devices"):
        Trainer(accelerator=fake4, devices=devices, **quiet())


def test_several_devices_without_strategy_means_ddp_or_names_the_package() -> None:
    if not _ddp_available():
        with pytest.raises((PluginUnavailableError, UnknownNameError), match="phalanx-strategy-ddp"):
            Trainer(accelerator="cpu", devices=2, **quiet())
        return
    from phalanx.strategies.parallel import ParallelStrategy

    trainer = Trainer(accelerator="cpu", devices=2, **quiet())
    assert trainer._strategy_name == "ddp"
    assert isinstance(trainer.strategy, ParallelStrategy)
    assert len(trainer.strategy.parallel_devices) == 2
    assert trainer.strategy.launcher is not None


def test_interactive_session_picks_ddp_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    assert is_interactive()
    if not _ddp_available():
        pytest.skip("phalanx-strategy-ddp is not installed")
    assert Trainer(accelerator="cpu", devices=2, **quiet())._strategy_name == "ddp_notebook"
    with pytest.raises(MisconfigurationError, match="interactive"):
        Trainer(strategy="ddp", accelerator="cpu", devices=2, **quiet())


def test_strategy_instance_and_custom_subclass() -> None:
    given = SingleDeviceStrategy("cpu")
    trainer = Trainer(strategy=given, precision="64", **quiet())
    assert trainer.strategy is given
    assert trainer.precision == "64-true"
    assert given.accelerator is not None

    class MyStrategy(SingleDeviceStrategy):
        strategy_name: ClassVar[str] = "my_single"

    StrategyRegistry.register("my_single", MyStrategy, description="test subclass")
    try:
        trainer = Trainer(strategy="my_single", **quiet())
        assert type(trainer.strategy) is MyStrategy
        assert trainer._strategy_name == "my_single"
    finally:
        StrategyRegistry.remove("my_single")
    trainer = Trainer(strategy=MyStrategy(), **quiet())
    assert trainer._strategy_name == "my_single"


def test_missing_plugin_names_the_distribution() -> None:
    name = "deepspeed"
    if name in StrategyRegistry and StrategyRegistry.entry(name).available:
        pytest.skip("the deepspeed plugin is installed here")
    with pytest.raises((PluginUnavailableError, UnknownNameError), match="phalanx-strategy-deepspeed"):
        Trainer(strategy=name, **quiet())


def test_plugins_by_instance_and_name() -> None:
    io = TorchCheckpointIO()
    trainer = Trainer(plugins=[io, "bf16-true"], **quiet())
    assert trainer.strategy.checkpoint_io is io
    assert trainer.precision == "bf16-true"
    trainer = Trainer(plugins="torch", **quiet())
    assert isinstance(trainer.strategy.checkpoint_io, TorchCheckpointIO)


@pytest.mark.parametrize(
    ("alias", "canonical"), [(32, "32-true"), ("64", "64-true"), (16, "16-mixed"), ("bf16", "bf16-mixed")]
)
def test_precision_aliases(alias: Any, canonical: str) -> None:
    assert Trainer(precision=alias, **quiet()).precision == canonical
