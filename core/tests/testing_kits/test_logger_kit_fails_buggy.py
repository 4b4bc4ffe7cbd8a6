"""The logger kit fails each buggy logger on the check its bug breaks (the csv logger passes: test_builtin_loggers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit_runner import assert_fails, run_kit

pytestmark = pytest.mark.timeout(300)

SOURCE = """
from metric_readers import read_csv_metrics
from phalanx.testing import LoggerConformance
import buggy_loggers as bad

class CSVKit(LoggerConformance):
    @classmethod
    def read_metrics(cls, save_dir):
        return read_csv_metrics(save_dir)

class TestEagerExperiment(CSVKit):
    logger = bad.EagerExperimentCSV

class TestOwnStep(CSVKit):
    logger = bad.OwnStepCSV

class TestUnflushed(CSVKit):
    logger = bad.UnflushedCSV
"""


def test_each_buggy_logger_fails_its_check(tmp_path: Path) -> None:
    (tmp_path / "metric_readers.py").write_text((Path(__file__).parent / "metric_readers.py").read_text())
    outcomes = run_kit(
        tmp_path,
        "buggy_loggers",
        SOURCE,
        "TestEagerExperiment::test_nothing_written_off_rank_zero",
        "TestOwnStep::test_written_metrics_survive_resume",
        "TestUnflushed::test_written_metrics_survive_resume",
        timeout=280,
    )
    assert_fails(
        outcomes, "TestEagerExperiment::test_nothing_written_off_rank_zero", "ranks other than 0 wrote files: {1: ["
    )
    # its counter also advances on validation rows, so even the uninterrupted fit's steps are off
    assert_fails(
        outcomes,
        "TestOwnStep::test_written_metrics_survive_resume",
        "fit's files hold train_loss at steps [0, 1, 2, 3, 5, 6]",
    )
    assert_fails(
        outcomes, "TestUnflushed::test_written_metrics_survive_resume", "fit's files hold train_loss at steps []"
    )
