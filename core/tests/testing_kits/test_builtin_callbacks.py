"""Built-in callbacks pass the callback kit in a real 2-rank job."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from phalanx.testing import CallbackConformance

pytestmark = pytest.mark.timeout(200)


class TestEarlyStoppingConformance(CallbackConformance):
    callback = "early_stopping"
    callback_params: ClassVar[dict[str, Any]] = {"patience": 5}


class TestEMAWeightAveragingConformance(CallbackConformance):
    callback = "ema_weight_averaging"
