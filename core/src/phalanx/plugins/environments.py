"""``lightning.pytorch.plugins.environments``: the cluster environments, under Lightning's names.

The classes are phalanx's (:mod:`phalanx.environments`). ``LightningEnvironment``, Lightning's
default for processes it starts itself (``MASTER_ADDR`` / ``MASTER_PORT`` / ``LOCAL_RANK`` /
``NODE_RANK``, a free port when none is set), is phalanx's
:class:`~phalanx.environments.local.LocalEnvironment`, which does exactly that. None of these
modules imports torch.
"""

from __future__ import annotations

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.environments.kubeflow import KubeflowEnvironment
from phalanx.environments.local import LocalEnvironment
from phalanx.environments.lsf import LSFEnvironment
from phalanx.environments.slurm import SLURMEnvironment
from phalanx.environments.torchelastic import TorchElasticEnvironment

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LightningEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
]

LightningEnvironment = LocalEnvironment
