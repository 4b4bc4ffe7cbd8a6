"""The XLA cluster environment: ranks come from torch-xla's runtime, not from variables phalanx sets.

Under torch-xla's launcher each worker learns its ordinal from PJRT. Asking the runtime in the
parent process would start it there and make the launch fail, so until the strategy marks itself
launched the answers are the planned ones (rank 0 of ``world_size`` processes).
"""

from __future__ import annotations

from phalanx.environments.cluster_environment import ClusterEnvironment

__all__ = ["XLAEnvironment"]


class XLAEnvironment(ClusterEnvironment):
    """Ranks and world size as torch-xla's PJRT runtime reports them inside launched workers."""

    def __init__(self) -> None:
        self.launched = False
        self._planned_world_size = 1

    @property
    def creates_processes_externally(self) -> bool:
        """False: phalanx starts the workers through torch-xla's launcher."""
        return False

    @property
    def main_address(self) -> str:
        """The runtime's coordinator address (workers rendezvous through PJRT, not a TCP store)."""
        if not self.launched:
            return "127.0.0.1"
        import torch_xla.runtime as xr

        return str(xr.get_master_ip())

    @property
    def main_port(self) -> int:
        """Unused by XLA (PJRT picks its own coordinator port); 0 means "none"."""
        return 0

    @staticmethod
    def detect() -> bool:
        """Never auto-detected: the xla strategies install this environment themselves."""
        return False

    def world_size(self) -> int:
        """Replicas in the job (``xr.world_size()`` once launched)."""
        if not self.launched:
            return self._planned_world_size
        import torch_xla.runtime as xr

        return int(xr.world_size())

    def set_world_size(self, size: int) -> None:
        """Remember the planned size, reported until the workers run (the runtime decides after)."""
        self._planned_world_size = int(size)

    def global_rank(self) -> int:
        """This replica's global ordinal."""
        if not self.launched:
            return 0
        import torch_xla.runtime as xr

        return int(xr.global_ordinal())

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the runtime assigns ordinals."""

    def local_rank(self) -> int:
        """This replica's ordinal on its host."""
        if not self.launched:
            return 0
        import torch_xla.runtime as xr

        return int(xr.local_ordinal())

    def node_rank(self) -> int:
        """Index of this host: global ordinal divided by the replicas per host."""
        if not self.launched:
            return 0
        import torch_xla.runtime as xr

        return int(xr.global_ordinal()) // max(1, int(xr.local_device_count()))

    def teardown(self) -> None:
        """Back to "not launched" so a later run in this process plans again."""
        self.launched = False
