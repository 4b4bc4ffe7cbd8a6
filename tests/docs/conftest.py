"""Marks for the documentation snippet tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "docs_long: a documentation snippet that takes more than a few seconds")
