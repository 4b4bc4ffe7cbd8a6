"""The strategy capabilities are declared in one place, documented in one table, and shown per strategy."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx._cli.listing import print_plugins
from phalanx.registry import StrategyRegistry
from phalanx.strategies import ParallelStrategy, SingleDeviceStrategy, Strategy
from phalanx.strategies.capabilities import CAPABILITIES, capabilities, declared_differences

ROOT = Path(__file__).resolve().parents[2]


def test_every_capability_is_an_attribute_of_the_base_classes() -> None:
    for name in CAPABILITIES:
        assert hasattr(Strategy, name) or hasattr(ParallelStrategy, name), name


def test_the_documented_table_lists_exactly_the_declared_capabilities() -> None:
    page = (ROOT / "docs" / "plugins.md").read_text()
    section = page[page.index("## Capabilities") :]
    section = section[: section.index("\n## ", 1)]
    documented = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
    assert documented == list(CAPABILITIES)


def test_a_strategy_declares_what_differs_from_its_base() -> None:
    class Pipelined(ParallelStrategy):
        @property
        def training_step_runs_backward(self) -> bool:
            return True

    single = SingleDeviceStrategy()
    assert "supported_start_methods" not in capabilities(single)  # a ParallelStrategy capability
    assert declared_differences(single) == {"passes_step_through": True}  # Strategy says False
    declared = declared_differences(Pipelined())
    assert declared["training_step_runs_backward"] is True
    assert declared["passes_step_through"] is False  # never inherited: its class body does not set it


def test_plugins_verbose_prints_a_line_per_registered_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    assert print_plugins(as_json=False, verbose=True) == 0
    out = capsys.readouterr().out
    assert "CAPABILITIES" in out
    for name in StrategyRegistry.available_strategies():
        assert f"  {name}: " in out, name
