"""``lightning.pytorch.plugins.io.async_plugin``: :class:`AsyncCheckpointIO`, writes on a background thread (:mod:`phalanx.checkpoint_io.async_io`)."""

from __future__ import annotations

from phalanx.checkpoint_io.async_io import AsyncCheckpointIO

__all__ = ["AsyncCheckpointIO"]
