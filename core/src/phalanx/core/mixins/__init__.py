"""``lightning.pytorch.core.mixins``: the hyperparameter mixin shared by Module and DataModule."""

from __future__ import annotations

from phalanx.hparams import HyperparametersMixin

__all__ = ["HyperparametersMixin"]
