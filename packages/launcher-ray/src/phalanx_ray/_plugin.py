"""The ``ray`` plugin's hook implementations: the ``ray`` cluster environment, its detection, and
the ``ray_train_report`` callback.

Imports neither torch nor ray: listing plugins runs these hooks, and a machine without Ray must
still list both names (as unavailable, with the pip command that fixes it). Targets are strings,
imported only when used.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from phalanx import hookimpl

if TYPE_CHECKING:
    from phalanx.registry import Registry

__all__ = [
    "REQUIRES",
    "phalanx_detect_cluster_environment",
    "phalanx_register_callbacks",
    "phalanx_register_cluster_environments",
]

#: What a Ray Train run needs: Ray with its Train library (``TorchTrainer``, ``ray.train.report``).
REQUIRES = ("ray[train]>=2.60",)
ENVIRONMENT = "phalanx_ray.environment:RayEnvironment"


@hookimpl
def phalanx_register_cluster_environments(registry: Registry) -> None:
    """Register ``ray``: ranks and the process group of a Ray Train worker."""
    registry.register(
        "ray",
        ENVIRONMENT,
        "A Ray Train worker (TorchTrainer): ranks and process group from Ray Train",
        requires=REQUIRES,
    )


@hookimpl
def phalanx_register_callbacks(registry: Registry) -> None:
    """Register ``ray_train_report``: every checkpoint phalanx writes is reported to Ray Train."""
    registry.register(
        "ray_train_report",
        "phalanx_ray.callback:RayTrainReportCallback",
        "Report each checkpoint phalanx writes (and the logged metrics) to ray.train.report",
        requires=REQUIRES,
    )


@hookimpl
def phalanx_detect_cluster_environment() -> str | None:
    """``"ray"`` inside a Ray Train worker, before the built-in detector is asked.

    Answering here, rather than leaving it to the built-in detector's walk over the registered
    environments, keeps a Ray cluster started inside a SLURM allocation from being taken for a
    SLURM job step (its workers inherit ``SLURM_NTASKS``). ``PHALANX_CLUSTER_ENVIRONMENT``, the
    user's explicit choice, still wins: the built-in detector reads it.
    """
    from phalanx.registry import ClusterEnvironmentRegistry
    from phalanx_ray.environment import RayEnvironment

    if os.environ.get("PHALANX_CLUSTER_ENVIRONMENT") or not RayEnvironment.detect():
        return None
    return "ray" if ClusterEnvironmentRegistry.entry("ray").available else None
