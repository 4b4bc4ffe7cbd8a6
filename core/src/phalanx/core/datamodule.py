"""``lightning.pytorch.core.datamodule`` under the rename rule: ``DataModule`` (Lightning's ``LightningDataModule``)."""

from __future__ import annotations

from phalanx.datamodule import DataModule

__all__ = ["DataModule"]
