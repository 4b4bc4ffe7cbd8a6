"""Kubeflow's PyTorchJob: one process per pod, ranks and rendezvous published by the operator.

The PyTorchJob operator starts every replica itself and sets ``MASTER_ADDR``, ``MASTER_PORT``,
``WORLD_SIZE`` and ``RANK`` in each pod, with one process (and so local rank 0) per pod; the pod's
rank is also its node rank. Nothing in those variables tells a PyTorchJob apart from a hand-made
``torch.distributed`` setup, so this environment is never detected: pass
``Trainer(plugins=[KubeflowEnvironment()])``, as with Lightning.
"""

from __future__ import annotations

import logging
import os

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.environments.local import parse_int_env

__all__ = ["KubeflowEnvironment"]

log = logging.getLogger(__name__)


def _required(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        msg = (
            f"KubeflowEnvironment reads {name} from the environment, and it is not set: this process was not "
            "started by Kubeflow's PyTorchJob operator. Fix: run it as a PyTorchJob replica, or drop "
            "KubeflowEnvironment from Trainer(plugins=...)."
        )
        raise KeyError(msg)
    return value


class KubeflowEnvironment(ClusterEnvironment):
    """Ranks and rendezvous from the variables Kubeflow's PyTorchJob operator sets (one process per pod)."""

    @property
    def creates_processes_externally(self) -> bool:
        """Always: the operator starts every replica."""
        return True

    @property
    def main_address(self) -> str:
        return _required("MASTER_ADDR")

    @property
    def main_port(self) -> int:
        return parse_int_env("MASTER_PORT", _required("MASTER_PORT"))

    @staticmethod
    def detect() -> bool:
        """Not detectable (see the module docstring): raises, as Lightning's does.

        Raises:
            NotImplementedError: Always; pass the environment to the Trainer instead.
        """
        msg = (
            "KubeflowEnvironment cannot be detected from the environment; pass Trainer(plugins=[KubeflowEnvironment()])"
        )
        raise NotImplementedError(msg)

    def world_size(self) -> int:
        return parse_int_env("WORLD_SIZE", _required("WORLD_SIZE"))

    def set_world_size(self, size: int) -> None:
        log.debug("KubeflowEnvironment keeps WORLD_SIZE from the operator; set_world_size(%s) ignored", size)

    def global_rank(self) -> int:
        return parse_int_env("RANK", _required("RANK"))

    def set_global_rank(self, rank: int) -> None:
        log.debug("KubeflowEnvironment keeps RANK from the operator; set_global_rank(%s) ignored", rank)

    def local_rank(self) -> int:
        """0: one process per pod."""
        return 0

    def node_rank(self) -> int:
        """The pod's rank: each pod is a node of its own."""
        return self.global_rank()
