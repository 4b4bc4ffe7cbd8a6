"""``lightning.pytorch.loops.optimization``: the optimization step's public names (see the modules below)."""

from __future__ import annotations

__all__: list[str] = []
