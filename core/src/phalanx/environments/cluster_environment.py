"""The ClusterEnvironment contract: who tells a process its rank and where rank 0 listens.

A distributed job needs four facts per process before the first collective: its global rank, the
world size, and the address and port of the rendezvous (rank 0's TCP store). Different launchers
publish them differently (phalanx's own launcher, torchrun, SLURM's srun), so the strategy asks a
ClusterEnvironment instead of reading environment variables itself.

This module must not import torch: the cluster-environment detection hook imports it while listing
plugins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["ClusterEnvironment"]


class ClusterEnvironment(ABC):
    """Where a process learns its place in a distributed job.

    Subclasses read what their launcher publishes. ``set_world_size`` / ``set_global_rank`` exist
    for environments where phalanx itself decides the ranks (the local one); environments whose
    scheduler assigns ranks ignore them.
    """

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """Whether something other than phalanx starts the processes (torchrun, srun, a re-run child).

        When true, a launcher must not start processes of its own: they already exist.
        """

    @property
    @abstractmethod
    def main_address(self) -> str:
        """Host name or IP address of the rank-0 process (the rendezvous TCP store)."""

    @property
    @abstractmethod
    def main_port(self) -> int:
        """TCP port of the rendezvous on :attr:`main_address`."""

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether this process runs under this environment (judged from environment variables)."""

    @abstractmethod
    def world_size(self) -> int:
        """Number of processes in the whole job."""

    @abstractmethod
    def set_world_size(self, size: int) -> None:
        """Record the world size phalanx computed (ignored where the scheduler decides it)."""

    @abstractmethod
    def global_rank(self) -> int:
        """Rank of this process among all processes of the job."""

    @abstractmethod
    def set_global_rank(self, rank: int) -> None:
        """Record the global rank phalanx computed (ignored where the scheduler decides it)."""

    @abstractmethod
    def local_rank(self) -> int:
        """Rank of this process among the processes of its machine (selects its device)."""

    @abstractmethod
    def node_rank(self) -> int:
        """Index of this process's machine among the machines of the job."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:  # noqa: B027 - optional check
        """Check the Trainer's ``devices`` / ``num_nodes`` against what the scheduler allocated.

        Called by the Trainer's connector so that a mismatch fails at construction with a message
        naming both numbers, instead of hanging at the first collective. No-op by default.
        """

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Forget per-run state at the end of a run. No-op by default."""

    def last_checkpoint(self) -> str | None:
        """A checkpoint of this run that the scheduler keeps outside the Trainer's directories (Ray
        Train's latest reported one, which a restarted worker on another node has no local copy of).

        ``ckpt_path="last"`` weighs it with the checkpoints in the Trainer's own directories (the
        newest wins), so a job restarted by its scheduler resumes with no change to the script.
        None by default: nothing kept elsewhere.
        """
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
