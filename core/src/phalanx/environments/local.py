"""The default environment: this machine, where phalanx's own launcher starts the processes.

phalanx's launcher (``strategy="ddp"``) re-runs the user's script with ``MASTER_ADDR``,
``MASTER_PORT``, ``WORLD_SIZE``, ``NODE_RANK`` and ``LOCAL_RANK`` set; this environment reads those
variables, and supplies defaults (localhost, a free port) when the user set nothing. On several
machines, the user sets ``MASTER_ADDR`` / ``MASTER_PORT`` / ``NODE_RANK`` on each and runs the same
command; each machine's launcher then starts its local ranks.
"""

from __future__ import annotations

import os
import socket

from phalanx.environments.cluster_environment import ClusterEnvironment
from phalanx.errors import MisconfigurationError

__all__ = ["LocalEnvironment", "find_free_port", "parse_int_env"]


def find_free_port() -> int:
    """Ask the OS for a TCP port nobody listens on (bind port 0, read it back, release it).

    The port is free when returned, not reserved; rank 0 binds it moments later, which is how
    torchrun and Lightning pick theirs too.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class LocalEnvironment(ClusterEnvironment):
    """Ranks and rendezvous for processes phalanx starts on this machine (or the same on each machine).

    The port is chosen once per instance and cached, so the launcher and every later call agree on
    it; the launcher exports it as ``MASTER_PORT`` so that the re-run children read the same value.
    """

    def __init__(self) -> None:
        self._main_port: int | None = None
        self._global_rank = 0
        self._world_size = 1

    @property
    def creates_processes_externally(self) -> bool:
        """True in a process phalanx (or a user) already started as a rank: ``LOCAL_RANK`` is set."""
        return "LOCAL_RANK" in os.environ

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR``, or 127.0.0.1 (the loopback address, which cannot clash with a hostname)."""
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        """``MASTER_PORT``, or a free port picked once for this instance."""
        if self._main_port is None:
            value = os.environ.get("MASTER_PORT")
            self._main_port = parse_int_env("MASTER_PORT", value) if value else find_free_port()
        return self._main_port

    @staticmethod
    def detect() -> bool:
        """Always true: this is the fallback when no scheduler is detected."""
        return True

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        self._world_size = size

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank

    def local_rank(self) -> int:
        return parse_int_env("LOCAL_RANK", os.environ.get("LOCAL_RANK", "0"))

    def node_rank(self) -> int:
        """``NODE_RANK``, else ``GROUP_RANK`` (torchrun's name for it), else 0."""
        value = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))
        return parse_int_env("NODE_RANK", value)

    def teardown(self) -> None:
        """Forget the cached port so that a later run in this process can pick a fresh one."""
        if "MASTER_PORT" not in os.environ:
            self._main_port = None


def parse_int_env(name: str, value: str | None) -> int:
    """Read an integer environment variable, failing with a message that names it and the fix."""
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        msg = (
            f"environment variable {name}={value!r} is not an integer; phalanx reads it as a rank or "
            f"port number. Fix: set {name} to a whole number (e.g. {name}=0) or unset it."
        )
        raise MisconfigurationError(msg) from None
