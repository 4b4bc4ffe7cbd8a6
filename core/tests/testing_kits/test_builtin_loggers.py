"""The csv and tensorboard loggers pass the logger kit in a real 2-rank job."""

from __future__ import annotations

from pathlib import Path

import pytest
from metric_readers import read_csv_metrics, read_tensorboard_metrics

from phalanx.testing import LoggerConformance

pytestmark = pytest.mark.timeout(200)


class TestCSVLoggerConformance(LoggerConformance):
    logger = "csv"

    @classmethod
    def read_metrics(cls, save_dir: Path) -> dict[str, dict[int, float]]:
        return read_csv_metrics(save_dir)


class TestTensorBoardLoggerConformance(LoggerConformance):
    logger = "tensorboard"
    atol = 1e-6  # event files store float32, as the logged tensors are

    @classmethod
    def read_metrics(cls, save_dir: Path) -> dict[str, dict[int, float]]:
        return read_tensorboard_metrics(save_dir)
