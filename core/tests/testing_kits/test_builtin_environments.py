"""The core's local, torchelastic and slurm environments pass the cluster environment kit.

Each example is one process of a 2-node job with 4 processes per node: global rank 5 is local
rank 1 on node 1, as the launcher would publish it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from phalanx.testing import ClusterEnvironmentConformance

_EXPECTED: dict[str, Any] = {
    "global_rank": 5,
    "world_size": 8,
    "local_rank": 1,
    "node_rank": 1,
    "main_address": "10.0.0.7",
    "main_port": 29512,
}


class TestTorchElasticConformance(ClusterEnvironmentConformance):
    cluster_environment = "torchelastic"
    job_environment: ClassVar[dict[str, str]] = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "TORCHELASTIC_RUN_ID": "kit",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29512",
    }
    expected = _EXPECTED
    allocation = (4, 2)


class TestSLURMConformance(ClusterEnvironmentConformance):
    cluster_environment = "slurm"
    job_environment: ClassVar[dict[str, str]] = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NAME": "train",
        "SLURM_NODELIST": "node[07-08]",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29512",
    }
    expected = _EXPECTED
    allocation = (4, 2)


class TestLocalConformance(ClusterEnvironmentConformance):
    """A process phalanx's own launcher started as rank 5 (it reads ranks it was told, and these variables)."""

    cluster_environment = "local"
    job_environment: ClassVar[dict[str, str]] = {
        "LOCAL_RANK": "1",
        "NODE_RANK": "1",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29512",
    }
    expected = _EXPECTED
    detects_everywhere = True  # the fallback
    validates_allocation = False  # no scheduler allocated anything

    @classmethod
    def _environment(cls) -> Any:
        environment = super()._environment()
        environment.set_global_rank(5)  # the launcher's decision, given through the setters
        environment.set_world_size(8)
        return environment
