"""How Trainer(...) resolves accelerator / strategy / devices / precision / plugins.

Tests whose names end in ``_fake_hardware`` register an accelerator that pretends to have devices:
the only place the project allows faking hardware counts.
"""

from __future__ import annotations

import importlib.metadata
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
from phalanx.trainer.strategy_resolution import is_interactive
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


class FourSlotAccelerator(Accelerator):
    """A test accelerator with four numbered slots, to exercise the shared index parsing."""

    name: ClassVar[str] = "cpu"  # lets get_parallel_devices build real torch devices

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 4


@pytest.fixture
def fake4() -> Iterator[str]:
    AcceleratorRegistry.register("fake4", FourDevices, description="test double with 4 devices")
    yield "fake4"
    AcceleratorRegistry.remove("fake4")


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


#: The tests-core session installs the core alone, so these run there; where the plugin is installed
#: its own tests check what the name resolves to (packages/strategy-ddp/tests/test_ddp_connector.py).
core_without_ddp = pytest.mark.skipif(
    _installed("phalanx-strategy-ddp"), reason="checks the core alone; phalanx-strategy-ddp is installed here"
)


def test_auto_on_this_machine_is_single_device() -> None:
    trainer = Trainer(**quiet())
    assert isinstance(trainer.strategy, SingleDeviceStrategy)
    assert trainer.strategy.accelerator is not None
    assert trainer.precision == "32-true"
    assert (trainer.world_size, trainer.global_rank, trainer.is_global_zero) == (1, 0, True)


@core_without_ddp
@pytest.mark.parametrize("devices", ["auto", -1, 2, [1, 3], "0,1,2", "3"])
def test_several_devices_without_ddp_name_the_package_fake_hardware(fake4: str, devices: Any) -> None:
    """The resolution to ddp itself is checked where ddp is installed (packages/strategy-ddp/tests)."""
    with pytest.raises((PluginUnavailableError, UnknownNameError), match="phalanx-strategy-ddp"):
        Trainer(accelerator=fake4, devices=devices, **quiet())


@pytest.mark.parametrize("devices", ["1,", 1, [2], "3,"])
def test_one_device_index_is_single_device_fake_hardware(fake4: str, devices: Any) -> None:
    trainer = Trainer(accelerator=fake4, devices=devices, **quiet())
    assert trainer.num_devices == 1
    assert isinstance(trainer.strategy, SingleDeviceStrategy)


@pytest.mark.parametrize("devices", [5, [4], "0,0", [-1]])
def test_devices_out_of_range_fake_hardware(fake4: str, devices: Any) -> None:
    with pytest.raises(MisconfigurationError, match="devices"):
        Trainer(accelerator=fake4, devices=devices, **quiet())


@core_without_ddp
def test_two_cpu_processes_without_ddp_name_the_package() -> None:
    with pytest.raises((PluginUnavailableError, UnknownNameError), match="phalanx-strategy-ddp"):
        Trainer(accelerator="cpu", devices=2, **quiet())


def test_interactive_session_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sys, "ps1", raising=False)
    assert not is_interactive()
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    assert is_interactive()


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
        assert trainer.strategy_name == "my_single"
    finally:
        StrategyRegistry.remove("my_single")
    trainer = Trainer(strategy=MyStrategy(), **quiet())
    assert trainer.strategy_name == "my_single"


@pytest.mark.skipif(_installed("phalanx-strategy-deepspeed"), reason="phalanx-strategy-deepspeed is installed here")
def test_missing_plugin_names_the_distribution() -> None:
    with pytest.raises((PluginUnavailableError, UnknownNameError), match="phalanx-strategy-deepspeed"):
        Trainer(strategy="deepspeed", **quiet())


@pytest.mark.skipif(
    _installed("phalanx-strategy-model-parallel"), reason="phalanx-strategy-model-parallel is installed here"
)
def test_missing_model_parallel_plugin_names_the_distribution() -> None:
    import phalanx.strategies as strategies

    with pytest.raises(
        (PluginUnavailableError, UnknownNameError), match="provided by phalanx-strategy-model-parallel.*pip install"
    ):
        Trainer(strategy="model_parallel", **quiet())
    with pytest.raises(ImportError, match="provided by phalanx-strategy-model-parallel.*pip install"):
        strategies.ModelParallelStrategy  # noqa: B018


def test_unloaded_model_parallel_plugin_names_the_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in every environment: blocked when installed, absent otherwise; both name the package."""
    import phalanx.strategies as strategies
    from phalanx import discovery

    monkeypatch.setenv("PHALANX_DISABLE_PLUGINS", "model_parallel")
    discovery._reset_for_tests()
    try:
        with pytest.raises((PluginUnavailableError, UnknownNameError), match="phalanx-strategy-model-parallel"):
            Trainer(strategy="model_parallel", **quiet())
        with pytest.raises(ImportError, match="phalanx-strategy-model-parallel"):
            strategies.ModelParallelStrategy  # noqa: B018
    finally:
        monkeypatch.delenv("PHALANX_DISABLE_PLUGINS")
        discovery._reset_for_tests()


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


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        (2, [0, 1]),
        ("2", [0, 1]),
        (-1, [0, 1, 2, 3]),
        ("-1", [0, 1, 2, 3]),
        ("auto", [0, 1, 2, 3]),
        ("1,3", [1, 3]),
        ("2,", [2]),
        (" 0, 1 ", [0, 1]),
        ([3, 0], [3, 0]),
        ((1,), [1]),
    ],
)
def test_shared_parsing_accepts_every_documented_spelling_fake_hardware(devices: object, expected: list[int]) -> None:
    assert FourSlotAccelerator.parse_devices(devices) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("devices", "fragment"),
    [
        (5, "only 4 are available"),
        ([0, 4], "valid indices are [0, 1, 2, 3]"),
        ("0,7", "valid indices are [0, 1, 2, 3]"),
        (0, "at least one device"),
        (-2, "at least one device"),
        ([0, 0], "repeats an index"),
        ([-1], "negative index"),
        ([], "not a valid index list"),
        ("0,x", "not a valid index list"),
        ("two", "is not valid"),
        (True, "is not valid"),
        (2.0, "type float"),
    ],
)
def test_shared_parsing_explains_bad_values_fake_hardware(devices: object, fragment: str) -> None:
    with pytest.raises(MisconfigurationError) as info:
        FourSlotAccelerator.parse_devices(devices)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert repr(devices) in str(info.value)


def test_parallel_devices_follow_the_parsed_indices_fake_hardware() -> None:
    assert FourSlotAccelerator.get_parallel_devices("1,3") == [torch.device("cpu", 1), torch.device("cpu", 3)]
