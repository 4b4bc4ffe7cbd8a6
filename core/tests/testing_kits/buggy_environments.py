"""Cluster environments with one real bug each; the cluster environment kit must fail every one of them."""

from __future__ import annotations

import os

from phalanx.environments.torchelastic import TorchElasticEnvironment


class RankIgnoringEnvironment(TorchElasticEnvironment):
    """Takes the local rank for the global rank: right on one node, wrong on every other."""

    def global_rank(self) -> int:
        return self.local_rank()


class AlwaysDetectingEnvironment(TorchElasticEnvironment):
    """Claims every process, so it would be picked even outside torchrun."""

    @classmethod
    def detect(cls) -> bool:
        return True


class PortSettingEnvironment(TorchElasticEnvironment):
    """Exports a default port while being asked whether it applies."""

    @classmethod
    def detect(cls) -> bool:
        os.environ.setdefault("MASTER_PORT", "29500")
        return super().detect()


class TorchImportingEnvironment(TorchElasticEnvironment):
    """Imports torch to detect itself: listing plugins then pays for a torch import."""

    @classmethod
    def detect(cls) -> bool:
        import torch.distributed.elastic  # noqa: F401

        return super().detect()


class TrustingEnvironment(TorchElasticEnvironment):
    """Accepts any devices / num_nodes: a mismatch with the launcher hangs at the first collective."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        del num_devices, num_nodes
