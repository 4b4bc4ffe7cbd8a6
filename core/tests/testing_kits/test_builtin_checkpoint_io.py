"""The core's torch and async checkpoint IOs pass the checkpoint IO kit."""

from __future__ import annotations

import pytest

from phalanx.testing import CheckpointIOConformance

pytestmark = pytest.mark.timeout(120)


class TestTorchCheckpointIOConformance(CheckpointIOConformance):
    checkpoint_io = "torch"


class TestAsyncCheckpointIOConformance(CheckpointIOConformance):
    checkpoint_io = "async"
