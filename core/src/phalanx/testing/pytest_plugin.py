"""pytest plugin shipped with phalanx-core (entry point ``pytest11``: ``phalanx``).

Registers the ``phalanx_conformance`` marker so vendor suites can select the conformance tests
with ``-m phalanx_conformance``, and deselects the kit's checks a suite opted out of
(``check_resume = False`` & co. on its StrategyConformance subclass): an opted-out check is a
decision written in the suite, not a skip that fires on every run.

``--phalanx-report=PATH`` writes the verified report (:mod:`phalanx.testing._report`): per kit
class, the plugin it checked and each check's outcome, with the core, torch and Python versions.
Without the option nothing is recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.testing._report import ReportBuilder

__all__ = ["ReportHooks", "pytest_addoption", "pytest_collection_modifyitems", "pytest_configure"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("phalanx").addoption(
        "--phalanx-report",
        metavar="PATH",
        default=None,
        help="write what phalanx's conformance kits ran and their outcome per plugin to PATH (JSON); "
        "ship it as <package>/phalanx-report.json for `phalanx plugins --verified`",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "phalanx_conformance: tests from phalanx's conformance kits")
    config.addinivalue_line(
        "markers", "timing: the test holds a wall-clock bound (under xdist, phalanx.testing.scheduling runs it alone)"
    )
    config.addinivalue_line(
        "markers", "waits: the test is asleep for most of its run (it takes none of --phalanx-cpu-slots)"
    )
    path = config.getoption("phalanx_report", None)
    if path:
        config.pluginmanager.register(ReportHooks(Path(path).resolve()), "phalanx-report")


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


class ReportHooks:
    """Feeds a :class:`ReportBuilder` from pytest's hooks and writes the report when the run ends.

    Kit tests are noted before any deselection (``tryfirst``) so a check left out by ``-k``, ``-m``
    or an opt-out flag is reported as deselected rather than missing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.builder = ReportBuilder()

    def _note(self, item: pytest.Item) -> bool:
        if item.get_closest_marker("phalanx_conformance") is None:
            return False
        return self.builder.note(item.nodeid, getattr(item, "cls", None), item.name)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            self._note(item)

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            if self._note(item):
                self.builder.set(item.nodeid, "deselected")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.builder.set(report.nodeid, "failed", report.duration)
        elif report.skipped and report.when in ("setup", "call"):
            self.builder.set(report.nodeid, "skipped", report.duration)
        elif report.passed and report.when == "call":
            self.builder.set(report.nodeid, "passed", report.duration)

    def pytest_sessionfinish(self) -> None:
        self.builder.write(self.path)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.write_line(f"phalanx conformance report written to {self.path}")
