"""pytest plugin shipped with phalanx-core (entry point ``pytest11``: ``phalanx``).

Registers the ``phalanx_conformance`` marker so vendor suites can select the conformance tests
with ``-m phalanx_conformance``.
"""

from __future__ import annotations

import pytest

__all__ = ["pytest_configure"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "phalanx_conformance: tests from phalanx's strategy conformance kit")
