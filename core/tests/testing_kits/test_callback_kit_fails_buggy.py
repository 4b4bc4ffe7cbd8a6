"""The callback kit fails each buggy callback on the check its bug breaks.

The kit passing correct callbacks is shown by test_builtin_callbacks.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kit_runner import assert_fails, run_kit

pytestmark = pytest.mark.timeout(300)

SOURCE = """
from phalanx.testing import CallbackConformance
import buggy_callbacks as bad

class TestForgetful(CallbackConformance):
    callback = bad.ForgetfulCounter

class TestEveryRankReport(CallbackConformance):
    callback = bad.EveryRankReport

class TestRankZeroSetup(CallbackConformance):
    callback = bad.RankZeroSetup
"""


def test_each_buggy_callback_fails_its_check(tmp_path: Path) -> None:
    outcomes = run_kit(
        tmp_path,
        "buggy_callbacks",
        SOURCE,
        "TestForgetful::test_state_survives_resume",
        "TestEveryRankReport::test_nothing_written_off_rank_zero",
        "TestRankZeroSetup::test_hooks_run_on_every_rank",
        timeout=280,
    )
    assert_fails(outcomes, "TestForgetful::test_state_survives_resume", "right after the restore")
    assert_fails(outcomes, "TestEveryRankReport::test_nothing_written_off_rank_zero", "'open full/report-rank1.txt'")
    assert_fails(
        outcomes,
        "TestRankZeroSetup::test_hooks_run_on_every_rank",
        "AttributeError: 'RankZeroSetup' object has no attribute 'summary'",
    )
