"""Ray Train: the worker processes exist already, and Ray Train told each one its place.

A function run by ``ray.train.torch.TorchTrainer`` runs once in each of ``num_workers`` Ray actor
processes. Before the function starts, Ray Train's torch backend sets torchrun's variables in every
worker (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``, and, with its
default ``TorchConfig(init_method="env")``, ``MASTER_ADDR`` / ``MASTER_PORT``) and creates the
default process group (gloo on CPU workers, nccl on GPU workers). So under Ray phalanx launches
nothing and joins nothing: ``ParallelStrategy`` finds the group initialised and uses it as it is,
leaving it for Ray Train to destroy.

This module imports neither torch nor ray: the environment-detection hook imports it while plugins
are listed, and detection reads environment variables only.
"""

from __future__ import annotations

import os

from phalanx.environments.launched import LaunchedEnvironment
from phalanx.environments.local import parse_int_env
from phalanx.errors import MisconfigurationError

__all__ = ["RAY_WORKER_VARIABLE", "RayEnvironment"]

#: Set by Ray's raylet in every Ray worker process (and inherited by what a worker starts): the
#: marker that torchrun-style variables came from Ray Train, not from torchrun or phalanx's launcher.
RAY_WORKER_VARIABLE = "RAY_JOB_ID"


class RayEnvironment(LaunchedEnvironment):
    """Ranks, world size and rendezvous of a Ray Train worker; phalanx's setters are ignored.

    Detected automatically inside a ``TorchTrainer`` training function (no ``plugins=[...]``
    needed). The Trainer's ``devices`` is the number of workers Ray placed on each node and
    ``num_nodes`` the number of nodes, as under torchrun: ``devices * num_nodes`` must equal
    ``ScalingConfig(num_workers=...)``.
    """

    launcher_name = "Ray Train"
    #: Ray Train's torch backend sets the five rank variables in each worker before the training
    #: function runs; the raylet sets RAY_JOB_ID. torchrun never sets NODE_RANK and phalanx's own
    #: launcher never sets RANK or LOCAL_WORLD_SIZE, so together they cannot come from either.
    required_variables = (RAY_WORKER_VARIABLE, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
    node_rank_variable = "NODE_RANK"
    local_world_size_variable = "LOCAL_WORLD_SIZE"
    launcher_options = "ScalingConfig(num_workers=...)"

    @classmethod
    def detect(cls) -> bool:
        """True in a Ray Train worker: a Ray worker process with Ray Train's rank variables set.

        A torchrun started from inside a Ray task also leaves Ray's marker in its workers' environment;
        torchrun's own ``TORCHELASTIC_RUN_ID`` hands those to ``TorchElasticEnvironment`` instead.
        """
        return super().detect() and "TORCHELASTIC_RUN_ID" not in os.environ

    @property
    def main_address(self) -> str:
        """``MASTER_ADDR``, which Ray Train sets to the address of the worker with rank 0."""
        return self._rendezvous_variable("MASTER_ADDR")

    @property
    def main_port(self) -> int:
        """``MASTER_PORT``, a free port Ray Train picked on the worker with rank 0."""
        return parse_int_env("MASTER_PORT", self._rendezvous_variable("MASTER_PORT"))

    def _rendezvous_variable(self, name: str) -> str:
        value = os.environ.get(name)
        if not value:
            msg = (
                f"Ray Train did not set {name} in this worker, so phalanx has no address to create a process group "
                "at (Ray Train creates the group itself, and phalanx needs the address only when none exists). "
                "Fix: keep TorchTrainer's default torch_config (TorchConfig(init_method='env')), or set MASTER_ADDR "
                "and MASTER_PORT in the workers' environment (runtime_env={'env_vars': {...}})."
            )
            raise MisconfigurationError(msg)
        return value

    def last_checkpoint(self) -> str | None:
        """Ray Train's latest reported checkpoint (after a restart, or when a run is resumed by
        name), so ``fit(ckpt_path="last")`` resumes from it with no Ray-specific line in the script."""
        from phalanx_ray.checkpoints import latest_checkpoint

        return latest_checkpoint()

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Fail at ``Trainer(...)`` when ``devices * num_nodes`` is not the number of Ray Train workers.

        Each Ray Train worker is one phalanx process (one rank). A mismatch would otherwise shard the
        data for a world that does not exist, or hang at the first collective. The worker's local
        rank must also name one of this node's ``devices``.
        """
        world = self.world_size()
        local = parse_int_env(self.local_world_size_variable, os.environ.get(self.local_world_size_variable))
        if num_devices * num_nodes != world:
            plural = "process" if num_devices * num_nodes == 1 else "processes"
            msg = (
                f"Trainer(devices={num_devices}, num_nodes={num_nodes}) asks for {num_devices * num_nodes} {plural}, "
                f"but Ray Train started {world} workers (ScalingConfig(num_workers={world}); {local} of them on this "
                f"node). Each Ray Train worker is one phalanx process. Fix: pass devices={local} (workers per node) "
                f"and num_nodes={max(1, world // max(1, local))} (nodes) so that devices x num_nodes = {world}, or "
                f"change ScalingConfig(num_workers={num_devices * num_nodes})."
            )
            raise MisconfigurationError(msg)
        if local > num_devices:
            msg = (
                f"Trainer(devices={num_devices}) gives each node {num_devices} processes, but Ray Train placed {local} "
                f"of its {world} workers on this node (LOCAL_RANK up to {local - 1}). Fix: make Ray place "
                f"{num_devices} workers on every node (ScalingConfig(resources_per_worker=...) or "
                "placement_strategy='SPREAD' with equal nodes), or pass devices equal to the workers per node."
            )
            raise MisconfigurationError(msg)
