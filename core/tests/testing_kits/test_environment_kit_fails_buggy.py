"""The cluster environment kit fails each buggy environment on the check its bug breaks, and passes torchelastic."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit_runner import assert_fails, assert_passes, run_kit

pytestmark = pytest.mark.timeout(120)

SOURCE = """
from phalanx.testing import ClusterEnvironmentConformance
import buggy_environments as bad

class TorchrunJob(ClusterEnvironmentConformance):
    job_environment = {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "4",
        "TORCHELASTIC_RUN_ID": "kit", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29512",
    }
    expected = {"global_rank": 5, "world_size": 8, "local_rank": 1, "node_rank": 1, "main_address": "10.0.0.7", "main_port": 29512}
    allocation = (4, 2)

class TestGood(TorchrunJob):
    cluster_environment = "torchelastic"

class TestRankIgnoring(TorchrunJob):
    cluster_environment = bad.RankIgnoringEnvironment

class TestAlwaysDetecting(TorchrunJob):
    cluster_environment = bad.AlwaysDetectingEnvironment

class TestPortSetting(TorchrunJob):
    cluster_environment = bad.PortSettingEnvironment
    job_environment = {k: v for k, v in TorchrunJob.job_environment.items() if k != "MASTER_PORT"}
    expected = {**TorchrunJob.expected, "main_port": 29500}

class TestTorchImporting(TorchrunJob):
    cluster_environment = bad.TorchImportingEnvironment

class TestTrusting(TorchrunJob):
    cluster_environment = bad.TrustingEnvironment
"""


def test_each_buggy_environment_fails_its_check(tmp_path: Path) -> None:
    outcomes = run_kit(
        tmp_path,
        "buggy_environments",
        SOURCE,
        "TestGood",
        "TestRankIgnoring::test_reads_ranks_and_rendezvous_from_the_environment",
        "TestAlwaysDetecting::test_detect",
        "TestPortSetting::test_detect",
        "TestTorchImporting::test_detect",
        "TestTrusting::test_validates_against_the_allocation",
    )
    for check in (
        "registered_and_described",
        "reads_ranks_and_rendezvous_from_the_environment",
        "detect",
        "validates_against_the_allocation",
    ):
        assert_passes(outcomes, f"TestGood::test_{check}")
    assert_fails(outcomes, "TestRankIgnoring::test_reads_ranks_and_rendezvous_from_the_environment", "'global_rank': 1")
    assert_fails(outcomes, "TestAlwaysDetecting::test_detect", "detect() is true without any of its variables")
    assert_fails(outcomes, "TestPortSetting::test_detect", "detect() changed environment variables ['MASTER_PORT']")
    assert_fails(outcomes, "TestTorchImporting::test_detect", "imports torch")
    assert_fails(outcomes, "TestTrusting::test_validates_against_the_allocation", "DID NOT RAISE")
