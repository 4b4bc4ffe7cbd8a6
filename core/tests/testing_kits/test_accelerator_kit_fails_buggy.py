"""The accelerator kit fails each buggy accelerator on the check its bug breaks, and passes cpu beside them."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit_runner import assert_fails, assert_passes, run_kit

pytestmark = pytest.mark.timeout(120)

SOURCE = """
from phalanx.testing import AcceleratorConformance
import buggy_accelerators as bad

class TestGood(AcceleratorConformance):
    accelerator = "cpu"
    enumerable = False

class TestNameless(AcceleratorConformance):
    accelerator = bad.NamelessAccelerator

class TestEnvSetting(AcceleratorConformance):
    accelerator = bad.EnvSettingAccelerator

class TestDeviceOpening(AcceleratorConformance):
    accelerator = bad.DeviceOpeningAccelerator

class TestCountIgnoring(AcceleratorConformance):
    accelerator = bad.CountIgnoringAccelerator
    enumerable = False

class TestMeta(AcceleratorConformance):
    accelerator = bad.MetaAccelerator

class TestDtypeChanging(AcceleratorConformance):
    accelerator = bad.DtypeChangingAccelerator
    enumerable = False
"""


def test_each_buggy_accelerator_fails_its_check(tmp_path: Path) -> None:
    outcomes = run_kit(
        tmp_path,
        "buggy_accelerators",
        SOURCE,
        "TestGood",
        "TestNameless::test_registered_and_described",
        "TestEnvSetting::test_is_available_has_no_side_effects",
        "TestDeviceOpening::test_is_available_has_no_side_effects",
        "TestCountIgnoring::test_parses_devices",
        "TestMeta::test_tensors_land_on_the_reported_device",
        "TestDtypeChanging::test_fit_runs_on_the_device",
    )
    for check in (
        "registered_and_described",
        "is_available_has_no_side_effects",
        "parses_devices",
        "tensors_land_on_the_reported_device",
        "fit_runs_on_the_device",
    ):
        assert_passes(outcomes, f"TestGood::test_{check}")
    assert_fails(outcomes, "TestNameless::test_registered_and_described", "name is empty")
    assert_fails(
        outcomes,
        "TestEnvSetting::test_is_available_has_no_side_effects",
        "changed environment variables ['PHALANX_KIT_VISIBLE_DEVICES']",
    )
    assert_fails(outcomes, "TestDeviceOpening::test_is_available_has_no_side_effects", "file descriptor(s) open")
    assert_fails(outcomes, "TestCountIgnoring::test_parses_devices", "devices=2 gave 1 device(s)")
    assert_fails(
        outcomes,
        "TestMeta::test_tensors_land_on_the_reported_device",
        "could not be read back to the CPU: Cannot copy out of meta tensor",
    )
    assert_fails(outcomes, "TestDtypeChanging::test_fit_runs_on_the_device", "after fit torch's (default dtype")
