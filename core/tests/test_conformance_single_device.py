"""The core's own single_device strategy passes the conformance kit it ships to vendors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from phalanx.strategies import SingleDeviceStrategy
from phalanx.testing import StrategyConformance


class TestSingleDeviceConformance(StrategyConformance):
    strategy = "single_device"
    devices = 1
    atol = 1e-6
    check_start_methods = False  # one process: nothing is launched


class _ClaimsMetaInit(SingleDeviceStrategy):
    """Declares empty_init_on_meta but its own tensor_init_context allocates real weights."""

    @property
    def empty_init_on_meta(self) -> bool:
        return True

    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        yield


class _KitOnAClaim(StrategyConformance):  # not collected (no Test prefix): run by hand below
    strategy = "single_device"
    devices = 1

    def _strategy_argument(self) -> Any:
        return _ClaimsMetaInit()


def test_the_kit_fails_a_declared_capability_the_strategy_does_not_have() -> None:
    with pytest.raises(AssertionError, match="empty_init_on_meta is True but tensor_init_context"):
        _KitOnAClaim().test_declared_capabilities_hold()
