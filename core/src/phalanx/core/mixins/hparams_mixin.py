"""``lightning.pytorch.core.mixins.hparams_mixin``: ``save_hyperparameters`` / ``hparams`` (:mod:`phalanx.hparams`)."""

from __future__ import annotations

from phalanx.hparams import HyperparametersMixin

__all__ = ["HyperparametersMixin"]
