"""The xla session fails, not skips, when torch-xla is missing; other sessions keep the skips."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
TESTS = '''
import pytest

def test_needs_torch_xla():
    pytest.importorskip("torch_xla_that_is_not_installed", reason="could not import 'torch_xla': simulated")

@pytest.mark.skipif(True, reason="checks the behaviour where torch-xla is not installed")
def test_without_torch_xla():
    pass
'''
MODULE_LEVEL = '''
import pytest
pytest.importorskip("torch_xla_that_is_not_installed", reason="could not import 'torch_xla': simulated")

def test_never_collected():
    pass
'''


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.syspathinsert(HERE)
    pytester.makeconftest("from xla_required import pytest_make_collect_report, pytest_runtest_makereport\n")
    pytester.makepyfile(test_run_time=TESTS, test_module_level=MODULE_LEVEL)
    return pytester


def test_required_turns_missing_torch_xla_skips_into_failures(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHALANX_REQUIRE_TORCH_XLA", "1")
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "test_run_time.py")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*PHALANX_REQUIRE_TORCH_XLA=1 (the xla session): torch-xla must import here*"])
    # A module-level importorskip becomes a collection error: the whole session fails.
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "test_module_level.py")
    result.assert_outcomes(errors=1)
    assert result.ret != 0


def test_not_required_keeps_the_skips(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PHALANX_REQUIRE_TORCH_XLA", raising=False)
    result = suite.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=3)
