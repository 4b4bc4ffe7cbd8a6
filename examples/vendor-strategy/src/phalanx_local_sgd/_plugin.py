"""Hook implementations only: no torch import, so `phalanx strategies` lists this plugin cheaply."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx import hookimpl

if TYPE_CHECKING:
    from phalanx.registry import Registry


@hookimpl
def phalanx_register_strategies(registry: Registry) -> None:
    """Register ``local_sgd`` by a string target: the class is imported only when it is selected."""
    registry.register(
        "local_sgd",
        "phalanx_local_sgd.strategy:LocalSGDStrategy",
        "Local SGD: every rank steps its own optimizer; parameters are averaged every sync_every steps (default 4)",
        requires=("torch>=2.1",),
    )
