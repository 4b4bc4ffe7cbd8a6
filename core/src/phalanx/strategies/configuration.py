"""What the Trainer resolved, handed to a strategy in one call: ``Strategy.configure(config)``.

The Trainer turns ``accelerator`` / ``strategy`` / ``devices`` / ``num_nodes`` / ``precision`` /
``plugins`` / ``sync_batchnorm`` into one frozen :class:`StrategyConfiguration` and calls
``strategy.configure(config)`` exactly once, before anything is launched. This is the only way the
Trainer configures a strategy: it never probes for attributes or sets private state, so a vendor's
strategy sees the same call the built-in ones do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from phalanx.accelerators.accelerator import Accelerator
    from phalanx.checkpoint_io.checkpoint_io import CheckpointIO
    from phalanx.environments.cluster_environment import ClusterEnvironment
    from phalanx.plugins.layer_sync import LayerSync
    from phalanx.precision.precision import Precision

__all__ = ["StrategyConfiguration"]


@dataclass(frozen=True)
class StrategyConfiguration:
    """The Trainer's resolved settings for one strategy.

    Attributes:
        strategy_name: The name the strategy was selected by (``"ddp"``, or the class name for an
            instance), for error messages and checkpoints.
        accelerator: The accelerator to use when the strategy was not given one.
        parallel_devices: One device per process on this node (``Trainer(devices=...)``).
        num_nodes: Number of machines (``Trainer(num_nodes=...)``).
        precision_plugin: The precision the strategy must use.
        checkpoint_io: A CheckpointIO from ``Trainer(plugins=...)``; ``None`` keeps the strategy's.
        cluster_environment: A ClusterEnvironment from ``Trainer(plugins=...)``; ``None`` keeps the
            strategy's (or detects one).
        sync_batchnorm: ``Trainer(sync_batchnorm=...)``, or True when ``layer_sync`` is given.
        layer_sync: A :class:`~phalanx.plugins.layer_sync.LayerSync` from ``Trainer(plugins=...)``;
            ``None`` means :class:`~phalanx.plugins.layer_sync.TorchSyncBatchNorm` when syncing.
        devices: ``Trainer(devices=...)`` as the user passed it, for messages.
    """

    strategy_name: str
    accelerator: Accelerator
    parallel_devices: tuple[torch.device, ...]
    num_nodes: int
    precision_plugin: Precision
    checkpoint_io: CheckpointIO | None = None
    cluster_environment: ClusterEnvironment | None = None
    sync_batchnorm: bool = False
    layer_sync: LayerSync | None = None
    devices: Any = None

    @property
    def num_processes(self) -> int:
        """The processes the Trainer asks for in the whole job: devices per node times nodes."""
        return len(self.parallel_devices) * self.num_nodes
