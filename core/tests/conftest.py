"""Fixtures shared by core's tests; every test must leave no process, port or env change behind."""

from __future__ import annotations

from plugin_fixtures import site_packages

from phalanx.testing.leaks import nothing_left_behind

__all__ = ["nothing_left_behind", "site_packages"]
