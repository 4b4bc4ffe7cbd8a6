"""The environment the ``deepspeed`` command-line launcher gives each rank it starts.

``deepspeed train.py`` (and ``deepspeed --hostfile ...`` across machines) starts the ranks itself
and publishes ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``CROSS_RANK`` (the node index) and ``LOCAL_SIZE``. It does not set torchrun's variables, so
without this environment phalanx would take the node rank to be 0 on every machine. No torch
import: environment detection runs while plugins are listed.
"""

from __future__ import annotations

import os

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.environments.local import parse_int_env
from phalanx.errors import MisconfigurationError

__all__ = ["DeepSpeedLauncherEnvironment"]

#: Set together only by DeepSpeed's launcher (deepspeed/launcher/launch.py).
_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CROSS_RANK", "LOCAL_SIZE")


class DeepSpeedLauncherEnvironment(ClusterEnvironment):
    """Ranks and rendezvous as the ``deepspeed`` launcher assigned them; phalanx's setters are ignored."""

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
        """All of the launcher's variables are set, and torchrun's are not (it wins when both are)."""
        return all(name in os.environ for name in _REQUIRED) and "TORCHELASTIC_RUN_ID" not in os.environ

    def world_size(self) -> int:
        return parse_int_env("WORLD_SIZE", os.environ.get("WORLD_SIZE"))

    def set_world_size(self, size: int) -> None:
        """Ignored: the launcher decided the world size."""

    def global_rank(self) -> int:
        return parse_int_env("RANK", os.environ.get("RANK"))

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the launcher decided the rank."""

    def local_rank(self) -> int:
        return parse_int_env("LOCAL_RANK", os.environ.get("LOCAL_RANK"))

    def node_rank(self) -> int:
        return parse_int_env("CROSS_RANK", os.environ.get("CROSS_RANK", "0"))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Fail at Trainer construction when ``devices * num_nodes`` differs from what the launcher started."""
        world = self.world_size()
        if num_devices * num_nodes != world:
            local = os.environ.get("LOCAL_SIZE", "?")
            msg = (
                f"Trainer(devices={num_devices}, num_nodes={num_nodes}) asks for {num_devices * num_nodes} processes, "
                f"but the deepspeed launcher started WORLD_SIZE={world} (LOCAL_SIZE={local}). Fix: pass "
                f"devices={local} and num_nodes equal to the number of hosts, or change the launcher's --num_gpus/--num_nodes."
            )
            raise MisconfigurationError(msg)
