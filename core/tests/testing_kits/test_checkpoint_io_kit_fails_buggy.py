"""The checkpoint IO kit fails each buggy IO on the check its bug breaks, and passes the torch IO beside them."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit_runner import assert_fails, assert_passes, run_kit

pytestmark = pytest.mark.timeout(180)

SOURCE = """
from phalanx.testing import CheckpointIOConformance
import buggy_checkpoint_io as bad

class TestGood(CheckpointIOConformance):
    checkpoint_io = "torch"

class TestInPlace(CheckpointIOConformance):
    checkpoint_io = bad.InPlaceIO

class TestBufferedInPlace(CheckpointIOConformance):
    checkpoint_io = bad.BufferedInPlaceIO
    kill_points = ("writing",)

class TestFloat32(CheckpointIOConformance):
    checkpoint_io = bad.Float32IO

class TestNoSnapshot(CheckpointIOConformance):
    checkpoint_io = bad.NoSnapshotAsyncIO

class TestDropping(CheckpointIOConformance):
    checkpoint_io = bad.DroppingAsyncIO

class TestKeeping(CheckpointIOConformance):
    checkpoint_io = bad.KeepingIO
"""


def test_each_buggy_checkpoint_io_fails_its_check(tmp_path: Path) -> None:
    outcomes = run_kit(
        tmp_path,
        "buggy_checkpoint_io",
        SOURCE,
        "TestGood::test_round_trip",
        "TestGood::test_teardown_flushes_pending_saves",
        "TestGood::test_remove",
        "TestInPlace::test_killed_mid_save_keeps_the_previous_checkpoint",
        "TestBufferedInPlace::test_killed_mid_save_keeps_the_previous_checkpoint",
        "TestFloat32::test_round_trip",
        "TestNoSnapshot::test_round_trip",
        "TestDropping::test_teardown_flushes_pending_saves",
        "TestKeeping::test_remove",
    )
    for check in ("round_trip", "teardown_flushes_pending_saves", "remove"):
        assert_passes(outcomes, f"TestGood::test_{check}")
    # the torch IO's own kill check runs in test_builtin_checkpoint_io.py
    assert_fails(
        outcomes, "TestInPlace::test_killed_mid_save_keeps_the_previous_checkpoint", "the path no longer loads"
    )
    assert_fails(
        outcomes,
        "TestBufferedInPlace::test_killed_mid_save_keeps_the_previous_checkpoint",
        "killed while writing a checkpoint over the previous one",
    )
    assert_fails(outcomes, "TestFloat32::test_round_trip", "came back as torch.float32, was saved as torch.bfloat16")
    assert_fails(outcomes, "TestNoSnapshot::test_round_trip", "came back with other values")
    assert_fails(
        outcomes, "TestDropping::test_teardown_flushes_pending_saves", "is missing after teardown(): a save was dropped"
    )
    assert_fails(outcomes, "TestKeeping::test_remove", "left the file in place")
