"""Cluster environments: how a process learns its rank, the world size and the rendezvous address.

None of these modules imports torch, so detection can run while plugins are merely listed.
"""

from __future__ import annotations

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.environments.kubeflow import KubeflowEnvironment
from phalanx.environments.launched import LaunchedEnvironment
from phalanx.environments.local import LocalEnvironment
from phalanx.environments.lsf import LSFEnvironment
from phalanx.environments.slurm import SLURMEnvironment
from phalanx.environments.torchelastic import TorchElasticEnvironment

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LaunchedEnvironment",
    "LocalEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
]
