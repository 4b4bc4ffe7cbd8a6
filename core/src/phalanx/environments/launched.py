"""A cluster environment whose ranks an external launcher published in environment variables.

torchrun, ``srun`` and the ``deepspeed`` launcher all start the processes themselves and tell each
one its rank, world size, local rank and node through variables; they differ only in the
variables' names and in the words of the fix when the Trainer asks for another world. This base
reads them once, in one place; a launcher's environment is a handful of class attributes.
"""

from __future__ import annotations

import os
from typing import ClassVar

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.environments.local import parse_int_env
from phalanx.errors import MisconfigurationError

__all__ = ["LaunchedEnvironment"]


class LaunchedEnvironment(ClusterEnvironment):
    """Ranks and rendezvous as an external launcher assigned them; phalanx's setters are ignored.

    Subclasses name the launcher and its variables (class attributes below); ``detect`` is true
    when every variable of :attr:`required_variables` is set.
    """

    #: How messages name the launcher, e.g. ``"torchrun"``.
    launcher_name: ClassVar[str] = "the launcher"
    #: Variables that together can only come from this launcher.
    required_variables: ClassVar[tuple[str, ...]] = ()
    world_size_variable: ClassVar[str] = "WORLD_SIZE"
    global_rank_variable: ClassVar[str] = "RANK"
    local_rank_variable: ClassVar[str] = "LOCAL_RANK"
    node_rank_variable: ClassVar[str] = "NODE_RANK"
    #: Processes per node, for the fix in messages.
    local_world_size_variable: ClassVar[str] = "LOCAL_WORLD_SIZE"
    #: The launcher's own options for processes per node and nodes, for the fix in messages.
    launcher_options: ClassVar[str] = "its processes-per-node and nodes options"

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return parse_int_env("MASTER_PORT", os.environ.get("MASTER_PORT", "29500"))

    @classmethod
    def detect(cls) -> bool:
        """True when every variable the launcher sets for its workers is present."""
        return bool(cls.required_variables) and all(name in os.environ for name in cls.required_variables)

    def _read(self, name: str, default: str | None = None) -> int:
        return parse_int_env(name, os.environ.get(name, default))

    def world_size(self) -> int:
        return self._read(self.world_size_variable)

    def set_world_size(self, size: int) -> None:
        """Ignored: the launcher decided the world size."""

    def global_rank(self) -> int:
        return self._read(self.global_rank_variable)

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the launcher decided the rank."""

    def local_rank(self) -> int:
        return self._read(self.local_rank_variable)

    def node_rank(self) -> int:
        return self._read(self.node_rank_variable, "0")

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Fail at ``Trainer(...)`` when ``devices * num_nodes`` differs from the world the launcher started."""
        world = self.world_size()
        if num_devices * num_nodes != world:
            local = os.environ.get(self.local_world_size_variable, "?")
            msg = (
                f"Trainer(devices={num_devices}, num_nodes={num_nodes}) asks for {num_devices * num_nodes} processes, "
                f"but {self.launcher_name} started {self.world_size_variable}={world} "
                f"({self.local_world_size_variable}={local}). Fix: pass devices={local} and num_nodes equal to the "
                f"number of nodes, or change {self.launcher_options}."
            )
            raise MisconfigurationError(msg)
