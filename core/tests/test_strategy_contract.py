"""The Trainer <-> Strategy contract: one configure call, and clear errors for strategies that break it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from phalanx import Trainer
from phalanx.errors import MisconfigurationError
from phalanx.registry import StrategyRegistry
from phalanx.strategies import ParallelStrategy, SingleDeviceStrategy, Strategy
from phalanx.strategies.configuration import StrategyConfiguration


class _Recording(SingleDeviceStrategy):
    """Counts configure calls and keeps what the Trainer resolved."""

    def __init__(self) -> None:
        super().__init__()
        self.configs: list[StrategyConfiguration] = []

    def configure(self, config: StrategyConfiguration) -> None:
        self.configs.append(config)
        super().configure(config)


class _TwoRanksNoLauncher(Strategy):
    """A vendor mistake: claims two ranks but starts nothing and joins no process group."""

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def is_global_zero(self) -> bool:
        return True

    @property
    def world_size(self) -> int:
        return 2

    def model_to_device(self) -> None:
        self.require_module().to(self.root_device)

    def all_gather(self, tensor, group=None, sync_grads=False):  # type: ignore[no-untyped-def]
        return tensor

    def reduce(self, tensor, group=None, reduce_op="mean"):  # type: ignore[no-untyped-def]
        return tensor

    def broadcast(self, obj, src=0):  # type: ignore[no-untyped-def]
        return obj

    def barrier(self, name=None):  # type: ignore[no-untyped-def]
        return None


class _Incomplete(Strategy):
    """Implements nothing of the abstract contract."""


class _NotAStrategy:
    pass


@pytest.fixture
def registered() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        StrategyRegistry.remove(name)


def test_configure_is_called_once_with_what_the_trainer_resolved() -> None:
    strategy = _Recording()
    trainer = Trainer(strategy=strategy, accelerator="cpu", devices=1, precision="bf16-mixed", logger=False)
    assert len(strategy.configs) == 1
    config = strategy.configs[0]
    assert config.parallel_devices == (torch.device("cpu"),)
    assert (config.num_nodes, config.num_processes, config.sync_batchnorm) == (1, 1, False)
    assert config.precision_plugin is trainer.precision_plugin
    assert trainer.precision == "bf16-mixed" and trainer.strategy.accelerator is config.accelerator
    with pytest.raises(AttributeError):
        config.num_nodes = 2  # type: ignore[misc]  # frozen: the strategy cannot change what was resolved


def test_a_world_nothing_launches_is_refused_not_run_in_one_process() -> None:
    with pytest.raises(MisconfigurationError, match=r"_TwoRanksNoLauncher reports world_size=2.*no launcher.*ParallelStrategy"):
        Trainer(strategy=_TwoRanksNoLauncher(), accelerator="cpu", devices=2, logger=False)


def test_parallel_strategy_builds_its_launcher_once_at_configuration() -> None:
    strategy = ParallelStrategy()
    Trainer(strategy=strategy, accelerator="cpu", devices=2, logger=False)
    launcher = strategy.launcher
    assert type(launcher).__name__ == "SubprocessScriptLauncher"
    assert strategy.launcher is launcher and strategy.world_size == 2
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 0}


def test_single_device_refuses_several_devices_naming_the_fix() -> None:
    with pytest.raises(MisconfigurationError, match=r"runs one process on one device.*devices=2.*strategy='auto' or 'ddp'"):
        Trainer(strategy="single_device", accelerator="cpu", devices=2, logger=False)


def test_a_registered_class_that_is_not_a_strategy_is_named(registered: list[str]) -> None:
    StrategyRegistry.register("not_a_strategy", _NotAStrategy, "broken on purpose")
    registered.append("not_a_strategy")
    with pytest.raises(MisconfigurationError, match=r"registered as 'not_a_strategy'.*not a phalanx Strategy class.*ParallelStrategy"):
        Trainer(strategy="not_a_strategy", accelerator="cpu", devices=1, logger=False)
    assert isinstance(StrategyRegistry.get("single_device"), SingleDeviceStrategy)  # the registry keeps working


def test_a_strategy_missing_abstract_methods_lists_them(registered: list[str]) -> None:
    StrategyRegistry.register("incomplete", _Incomplete, "broken on purpose")
    registered.append("incomplete")
    with pytest.raises(MisconfigurationError, match=r"_Incomplete .* does not implement .*is_global_zero.*model_to_device.*root_device"):
        Trainer(strategy="incomplete", accelerator="cpu", devices=1, logger=False)
    assert Trainer(strategy="single_device", accelerator="cpu", devices=1, logger=False).world_size == 1


def test_parallel_strategy_refuses_an_unknown_start_method() -> None:
    with pytest.raises(MisconfigurationError, match=r"start_method='thread'.*popen, spawn, fork, forkserver"):
        ParallelStrategy(start_method="thread")
