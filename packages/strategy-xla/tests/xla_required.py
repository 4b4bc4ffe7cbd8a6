"""In the session built to run torch-xla, a test skipped for want of torch-xla fails instead.

The ``xla`` nox session sets :data:`REQUIRE_VAR`; there, a skip whose reason says torch-xla could
not be imported or is not installed (``pytest.importorskip("torch_xla")``, the listing tests'
``needs torch-xla installed``) is turned into a failure, at collection or at run time, so a
torch-xla that installs but does not import cannot leave the session green. Elsewhere (the
``tests-strategy-xla`` session, which checks the plugin without torch-xla) those skips stay skips.
Skips for the opposite reason ("checks the behaviour where torch-xla is not installed") are not
touched. Imported by ``conftest.py``, which registers these hooks.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

__all__ = ["REQUIRE_VAR", "pytest_make_collect_report", "pytest_runtest_makereport"]

#: Set to 1 by the ``xla`` nox session.
REQUIRE_VAR = "PHALANX_REQUIRE_TORCH_XLA"
_MISSING = ("could not import 'torch_xla'", "needs torch-xla installed")


def _fail_missing_torch_xla(report: pytest.CollectReport | pytest.TestReport) -> None:
    if os.environ.get(REQUIRE_VAR) != "1" or not report.skipped:
        return
    longrepr: Any = report.longrepr
    reason = str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr)
    if any(text in reason for text in _MISSING):
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_VAR}=1 (the xla session): torch-xla must import here, but the test skipped: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    _fail_missing_torch_xla(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    _fail_missing_torch_xla(outcome.get_result())
