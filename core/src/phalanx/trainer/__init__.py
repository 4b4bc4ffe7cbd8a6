"""The Trainer and its loops; the public names are ``phalanx.Trainer`` and ``phalanx.trainer.trainer.Trainer``."""

from __future__ import annotations

__all__: list[str] = []
