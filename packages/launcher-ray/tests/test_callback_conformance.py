"""The core's callback kit on ``ray_train_report``, in a plain 2-rank job (no Ray there).

Outside a Ray Train worker the callback reports nothing, by design, so that a script using it
also runs without Ray; the kit holds it to what every callback owes a job: the same hooks on every
rank, nothing written off rank 0, and its (empty) state through a resume. Its reporting is checked
on a real Ray cluster in test_ray_cluster.py.
"""

from __future__ import annotations

import pytest

from phalanx.testing import CallbackConformance


@pytest.mark.timeout(240)
class TestRayTrainReportConformance(CallbackConformance):
    callback = "ray_train_report"
