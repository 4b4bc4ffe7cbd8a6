"""Fixtures shared by core's tests."""

from __future__ import annotations

from plugin_fixtures import site_packages

__all__ = ["site_packages"]
