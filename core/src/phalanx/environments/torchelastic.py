"""torchrun (TorchElastic): the processes exist already and torchrun published their ranks.

Under ``torchrun`` phalanx launches nothing; it reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``GROUP_RANK`` (the node rank), ``MASTER_ADDR`` and ``MASTER_PORT`` that torchrun sets for each
worker it starts.
"""

from __future__ import annotations

import os

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.environments.local import parse_int_env
from phalanx.errors import MisconfigurationError

__all__ = ["TorchElasticEnvironment"]

#: Set by torchrun for every worker; together they cannot come from anything else.
_REQUIRED = ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


class TorchElasticEnvironment(ClusterEnvironment):
    """Ranks and rendezvous as torchrun assigned them; phalanx's setters are ignored."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return parse_int_env("MASTER_PORT", os.environ.get("MASTER_PORT", "29500"))

    @staticmethod
    def detect() -> bool:
        """True when every variable torchrun sets for its workers is present."""
        return all(name in os.environ for name in _REQUIRED)

    def world_size(self) -> int:
        return parse_int_env("WORLD_SIZE", os.environ.get("WORLD_SIZE"))

    def set_world_size(self, size: int) -> None:
        """Ignored: torchrun decided the world size."""

    def global_rank(self) -> int:
        return parse_int_env("RANK", os.environ.get("RANK"))

    def set_global_rank(self, rank: int) -> None:
        """Ignored: torchrun decided the rank."""

    def local_rank(self) -> int:
        return parse_int_env("LOCAL_RANK", os.environ.get("LOCAL_RANK"))

    def node_rank(self) -> int:
        return parse_int_env("GROUP_RANK", os.environ.get("GROUP_RANK", "0"))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Fail early when ``devices * num_nodes`` differs from the world torchrun started."""
        world = self.world_size()
        if num_devices * num_nodes != world:
            local = os.environ.get("LOCAL_WORLD_SIZE", "?")
            msg = (
                f"Trainer(devices={num_devices}, num_nodes={num_nodes}) asks for "
                f"{num_devices * num_nodes} processes, but torchrun started WORLD_SIZE={world} "
                f"(LOCAL_WORLD_SIZE={local}). Fix: pass devices={local} and num_nodes equal to "
                "torchrun's --nnodes, or change torchrun's --nproc-per-node / --nnodes."
            )
            raise MisconfigurationError(msg)
