"""Ready-made models and data for tests, bug reports and demos (Lightning's ``lightning.pytorch.demos``).

``BoringModel`` / ``BoringDataModule`` and friends (:mod:`.boring_classes`) are tiny and random;
``LightningTransformer`` (:mod:`.transformer`) and ``LightningLSTM`` (:mod:`.lstm`) are language
models on WikiText-2 (downloaded on first use); ``MNISTDataModule`` is in :mod:`.mnist_datamodule`.
"""

from __future__ import annotations

from phalanx.demos.boring_classes import BoringDataModule, BoringModel, DemoModel
from phalanx.demos.lstm import LightningLSTM, SequenceSampler, SimpleLSTM
from phalanx.demos.transformer import LightningTransformer, Transformer, WikiText2

__all__ = [
    "BoringDataModule",
    "BoringModel",
    "DemoModel",
    "LightningLSTM",
    "LightningTransformer",
    "SequenceSampler",
    "SimpleLSTM",
    "Transformer",
    "WikiText2",
]
