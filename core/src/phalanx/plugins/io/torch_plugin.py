"""``lightning.pytorch.plugins.io.torch_plugin``: :class:`TorchCheckpointIO`, torch.save / torch.load, written atomically (:mod:`phalanx.checkpoint_io.torch_io`)."""

from __future__ import annotations

from phalanx.checkpoint_io.torch_io import TorchCheckpointIO

__all__ = ["TorchCheckpointIO"]
