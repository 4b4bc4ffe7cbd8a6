"""Layer synchronisation: swap layers for versions that share state across processes, and back.

A BatchNorm layer normalises with the statistics of the batch it sees; under data parallelism
each rank sees only its shard, so a small per-rank batch gives noisy statistics.
:class:`TorchSyncBatchNorm` replaces every BatchNorm with torch's ``SyncBatchNorm``, which reduces
the statistics over all ranks, and :meth:`~LayerSync.revert` turns them back into ordinary
BatchNorm layers (for export or single-process evaluation), weights and running statistics kept.

``Trainer(sync_batchnorm=True)`` applies :class:`TorchSyncBatchNorm` when the model is set up;
``Trainer(plugins=[MyLayerSync()])`` applies a custom :class:`LayerSync` instead.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

__all__ = ["LayerSync", "TorchSyncBatchNorm"]


class LayerSync(ABC):
    """Converts a model's layers to synchronised versions (:meth:`apply`) and back (:meth:`revert`)."""

    @abstractmethod
    def apply(self, model: nn.Module) -> nn.Module:
        """Return ``model`` with its layers replaced by synchronised ones (in place where possible)."""

    @abstractmethod
    def revert(self, model: nn.Module) -> nn.Module:
        """Return ``model`` with synchronised layers replaced by their plain counterparts."""


class _AnyDimBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A BatchNorm that accepts inputs of any rank: what a reverted ``SyncBatchNorm`` becomes.

    ``SyncBatchNorm`` does not record whether it replaced a 1d, 2d or 3d BatchNorm, so the reverted
    layer cannot be one of those three; it normalises over dimension 1 whatever the input's rank,
    which is what all three do.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            msg = f"expected an input of at least 2 dimensions (batch, channels, ...), got {input.dim()}"
            raise ValueError(msg)


class TorchSyncBatchNorm(LayerSync):
    """Every ``BatchNorm*d`` becomes ``torch.nn.SyncBatchNorm``, and back.

    ``SyncBatchNorm`` reduces over the default process group (or ``process_group``) during the
    training forward pass; torch runs it on GPUs only.
    """

    def apply(self, model: nn.Module) -> nn.Module:
        """Replace each BatchNorm layer with a ``SyncBatchNorm`` holding the same weights and statistics."""
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)

    def revert(self, model: nn.Module) -> nn.Module:
        """Replace each ``SyncBatchNorm`` with a plain BatchNorm holding the same weights and statistics."""
        converted = model
        if isinstance(model, nn.SyncBatchNorm):
            converted = _AnyDimBatchNorm(
                model.num_features, model.eps, model.momentum, model.affine, model.track_running_stats
            )
            if model.affine:
                with torch.no_grad():
                    converted.weight = model.weight
                    converted.bias = model.bias
            converted.running_mean = model.running_mean
            converted.running_var = model.running_var
            converted.num_batches_tracked = model.num_batches_tracked
            if hasattr(model, "qconfig"):
                converted.qconfig = model.qconfig
            converted.train(model.training)
        for name, child in model.named_children():
            converted.add_module(name, self.revert(child))
        return converted
