"""pytest plugin shipped with phalanx-core (entry point ``pytest11``: ``phalanx``).

Registers the ``phalanx_conformance`` marker so vendor suites can select the conformance tests
with ``-m phalanx_conformance``, and deselects the kit's checks a suite opted out of
(``check_resume = False`` & co. on its StrategyConformance subclass): an opted-out check is a
decision written in the suite, not a skip that fires on every run.
"""

from __future__ import annotations

import pytest

__all__ = ["pytest_collection_modifyitems", "pytest_configure"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "phalanx_conformance: tests from phalanx's strategy conformance kit")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        opted_out = getattr(getattr(item, "cls", None), "opted_out", None)
        name = getattr(item, "originalname", item.name)
        if item.get_closest_marker("phalanx_conformance") is not None and callable(opted_out) and opted_out(name):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
