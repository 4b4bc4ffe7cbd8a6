"""The precision kit fails each buggy precision on the check its bug breaks, and passes the correct one."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit_runner import assert_fails, assert_passes, run_kit

pytestmark = pytest.mark.timeout(120)

SOURCE = """
from phalanx.testing import PrecisionConformance
import buggy_precisions as bad

class Fp16Kit(PrecisionConformance):
    autocast_dtype = "float16"
    scales_loss = True

class TestGood(Fp16Kit):
    precision = bad.Fp16

class TestNoAutocast(Fp16Kit):
    precision = bad.NoAutocast

class TestUnscaledBackward(Fp16Kit):
    precision = bad.UnscaledBackward

class TestSkipsUnscale(Fp16Kit):
    precision = bad.SkipsUnscale

class TestForgetsScale(Fp16Kit):
    precision = bad.ForgetsScale
"""


def test_each_buggy_precision_fails_its_check(tmp_path: Path) -> None:
    outcomes = run_kit(
        tmp_path,
        "buggy_precisions",
        SOURCE,
        "TestGood",
        "TestNoAutocast::test_forward_matches_plain_torch",
        "TestUnscaledBackward::test_backward_matches_plain_torch",
        "TestSkipsUnscale::test_steps_match_plain_torch",
        "TestForgetsScale::test_state_survives_resume",
    )
    for check in (
        "registered_and_described",
        "forward_matches_plain_torch",
        "backward_matches_plain_torch",
        "steps_match_plain_torch",
        "state_survives_resume",
    ):
        assert_passes(outcomes, f"TestGood::test_{check}")
    assert_fails(
        outcomes,
        "TestNoAutocast::test_forward_matches_plain_torch",
        "forward gave torch.float32, the plain-PyTorch equivalent torch.float16",
    )
    assert_fails(
        outcomes, "TestUnscaledBackward::test_backward_matches_plain_torch", ".grad differs from plain PyTorch"
    )
    assert_fails(outcomes, "TestSkipsUnscale::test_steps_match_plain_torch", "is not finite after the steps")
    assert_fails(outcomes, "TestForgetsScale::test_state_survives_resume", "right after load_state_dict")
