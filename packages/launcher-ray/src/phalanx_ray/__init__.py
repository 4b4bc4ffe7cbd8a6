"""Run phalanx Trainers under Ray Train: the ``ray`` cluster environment, checkpoint reporting, and a helper.

- :class:`RayEnvironment` is detected inside a ``TorchTrainer`` training function, so a Trainer
  built there trains on the workers and process group Ray Train made, with any strategy.
- :class:`RayTrainReportCallback` reports each checkpoint phalanx writes to ``ray.train.report``;
  :func:`latest_checkpoint` gives the one to resume from after Ray restarted the workers.
- :func:`fit` does all of it from the driver: ``TorchTrainer``, the callback, the resume.

Every name is imported lazily: discovering this plugin imports the package to reach ``_plugin``,
and that must import neither torch nor ray.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = ["RayEnvironment", "RayTrainReportCallback", "checkpoint_path", "fit", "latest_checkpoint"]

if TYPE_CHECKING:
    from phalanx_ray._fit import fit
    from phalanx_ray.callback import RayTrainReportCallback
    from phalanx_ray.checkpoints import checkpoint_path, latest_checkpoint
    from phalanx_ray.environment import RayEnvironment

_HOMES = {
    "RayEnvironment": "phalanx_ray.environment",
    "RayTrainReportCallback": "phalanx_ray.callback",
    "checkpoint_path": "phalanx_ray.checkpoints",
    "latest_checkpoint": "phalanx_ray.checkpoints",
    "fit": "phalanx_ray._fit",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        msg = f"module 'phalanx_ray' has no attribute {name!r}; it offers {', '.join(__all__)}"
        raise AttributeError(msg)
    return getattr(import_module(home), name)
