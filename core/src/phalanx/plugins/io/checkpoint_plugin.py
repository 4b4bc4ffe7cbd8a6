"""``lightning.pytorch.plugins.io.checkpoint_plugin``: :class:`CheckpointIO`, the checkpoint IO base class (:mod:`phalanx.checkpoint_io.checkpoint_io`)."""

from __future__ import annotations

from phalanx.checkpoint_io.checkpoint_io import CheckpointIO

__all__ = ["CheckpointIO"]
